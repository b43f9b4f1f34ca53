"""`make chart`: lint charts/dspark and render it for every values profile into build/chart/<profile>/.

    python scripts/chart.py [--out build/chart]

Real Helm: its Go SDK through the helm-python-sdk package, so neither a helm binary nor a cluster is
needed. Profiles are the chart's defaults ("default") and every charts/dspark/ci/*.yaml. The tests
render through the same functions.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import helm_python as helm
import yaml

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "charts" / "dspark"
KUBE_VERSION = "v1.30.0"
RELEASE = "dspark"
NAMESPACE = "dspark"
LINT_INFO = 1  # helm lint severities: 1 info, 2 warning, 3 error


def profiles() -> dict[str, dict]:
    """Profile name -> its values (the chart's defaults are the profile "default")."""
    found = {"default": {}}
    for path in sorted((CHART / "ci").glob("*.yaml")):
        found[path.stem] = yaml.safe_load(path.read_text()) or {}
    return found


def lint(values: dict) -> list[str]:
    """Helm's findings above INFO, as 'path: message' lines (empty when the chart is clean)."""
    report = helm.lint(str(CHART), values, strict=True, kube_version=KUBE_VERSION)
    findings = [f"{m['path']}: {m['error']}" for m in report["messages"] if m["severity"] > LINT_INFO]
    return findings + list(report["errors"])


def render(values: dict, release: str = RELEASE, namespace: str = NAMESPACE) -> dict[str, str]:
    """Template file name -> rendered text, for the non-empty ones (raises on invalid values)."""
    with helm.Chart.load(str(CHART)) as chart:
        files = chart.render(values, name=release, namespace=namespace, is_install=True)
    return {Path(path).name: text for path, text in files.items() if text.strip()}


def manifests(values: dict, **kwargs) -> list[dict]:
    """Every Kubernetes object the chart renders for these values."""
    return [
        doc
        for name, text in render(values, **kwargs).items()
        if name.endswith(".yaml")
        for doc in yaml.safe_load_all(text)
        if doc
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "build" / "chart")
    args = parser.parse_args(argv)
    failed = False
    for name, values in profiles().items():
        if findings := lint(values):
            failed = True
            print(f"[chart] {name}: lint failed\n  " + "\n  ".join(findings), file=sys.stderr)
            continue
        out = args.out / name
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        for file_name, text in render(values).items():
            (out / file_name).write_text(text)
        print(f"[chart] {name}: lint clean, rendered into {out}/", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
