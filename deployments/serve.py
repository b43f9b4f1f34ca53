"""`make serve`: an embedded local Ray serving a Serve config file, HTTP :8000 and gRPC :9000.

    python -m deployments.serve --config configs/local.yaml [--demo]

Builds the demo models first when the config points at a missing `models/...` checkpoint, says where
traces and metrics go (the OTEL_* environment it starts in reaches every Ray process; an app's
`telemetry:` block wins), prints how to call the service, and shuts Serve and Ray down cleanly on
Ctrl-C. `--demo` runs the demo client session (deployments/demo.py) once the stack is up, then exits.
`--direct-ingress` lets the Ingress replicas serve HTTP and gRPC on ports of their own, no Serve proxy
in the path (deployments/direct_ingress.py); it prints their addresses (the proxy's ports keep serving).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def ensure_models(apps: list[dict]) -> None:
    """Build the demo stack (`make models`) when the target or its learned drafter is missing.

    Only for the demo layout (`.../target`, drafters in `.../drafters/NAME`); the build resumes, so a
    half-built stack is finished rather than redone. A user's own checkpoint is never touched.
    """
    for app in apps:
        model = Path(app["args"]["model"])
        drafter = app["args"].get("engine", {}).get("drafter", "none")
        missing = not (model / "config.json").is_file()
        if model.name == "target":
            missing |= not (model / ".complete").exists()
            if drafter not in ("none", "ngram"):
                missing |= not (model.parent / "drafters" / drafter / "config.json").is_file()
        if missing and model.name == "target":
            print(f"[serve] building the demo models into {model.parent}/ (first run only)", flush=True)
            subprocess.run(
                [sys.executable, "-m", "drafter_service.demo.build", "--out", str(model.parent)], check=True
            )


def check_drafters(apps: list[dict]) -> None:
    """A learned drafter whose checkpoint was not built falls back to n-gram drafting, said out loud."""
    from dspark.drafter import available_drafters

    for app in apps:
        engine = app["args"].setdefault("engine", {})
        name = engine.get("drafter", "none")
        if name in ("none", "ngram") or name not in available_drafters():
            continue
        path = Path(engine.get("drafter_model") or Path(app["args"]["model"]).parent / "drafters" / name)
        if not (path / "config.json").is_file():
            print(
                f"[serve] drafter {name!r} has no checkpoint at {path}; serving with drafter 'ngram'",
                flush=True,
            )
            engine["drafter"] = "ngram"
            engine.pop("drafter_model", None)


def describe_telemetry(apps: list[dict]) -> None:
    """Say where each app's traces and metrics go; fail now on a bad OTEL_* value, not in a replica."""
    from deployments.config import AppConfig
    from deployments.telemetry import describe

    for app in apps:
        try:
            line = describe(os.environ, AppConfig(**app["args"]).telemetry)
        except ValueError as e:
            raise SystemExit(f"[serve] {e}") from None
        print(f"[serve] {app['name']}: {line}", flush=True)


def check_resources(apps: list[dict], cpus: float) -> None:
    """Fail now, not after minutes of 'waiting to be scheduled', when the config asks for more CPUs."""
    from deployments.config import AppConfig

    need = 0.0
    for app in apps:
        c = AppConfig(**app["args"])
        need += c.max_replicas * c.tensor_parallel_size * c.replica_num_cpus
        need += c.max_ingress_replicas * c.ingress_num_cpus
    if need > cpus + 1e-9:
        raise SystemExit(
            f"[serve] the config asks for {need:g} logical CPUs but this Ray has {cpus:g}: lower "
            "replica_num_cpus / ingress_num_cpus or num_replicas (logical shares do not limit threads)"
        )


def usage(http_port: int, grpc_port: int, model: str) -> str:
    return f"""
DSpark is serving {model!r}:
  HTTP (OpenAI)  http://localhost:{http_port}/v1
                 /v1/models /v1/completions /v1/chat/completions /health
  gRPC           localhost:{grpc_port}            dspark.v1.Generation, grpc.health.v1.Health

  curl -s localhost:{http_port}/v1/completions -H 'Content-Type: application/json' \\
       -d '{{"model": "{model}", "prompt": "def parse_args(argv):", "max_tokens": 48, "temperature": 0}}'

  python -c "import openai; c = openai.OpenAI(base_url='http://localhost:{http_port}/v1', api_key='-');
print(c.completions.create(model='{model}', prompt='import os\\n', max_tokens=32).choices[0].text)"

  python -m deployments.demo --grpc localhost:{grpc_port}       # streams a completion over gRPC, prints stats

Ctrl-C stops it.
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/local.yaml", help="a Ray Serve config file")
    parser.add_argument("--demo", action="store_true", help="run the demo client once ready, then exit")
    parser.add_argument("--num-cpus", type=int, default=None, help="logical CPUs for the local Ray")
    parser.add_argument(
        "--direct-ingress", action="store_true", help="the ingress replicas serve HTTP/gRPC themselves"
    )
    args = parser.parse_args(argv)

    config = yaml.safe_load(Path(args.config).read_text())
    apps = config["applications"]
    ensure_models(apps)
    check_drafters(apps)
    describe_telemetry(apps)

    import ray
    from ray import serve

    from deployments.app import PROXY_ENV, build_app
    from deployments.direct_ingress import LOCAL_DIRECT_INGRESS_ENV, wait_for_endpoints

    started = time.monotonic()
    ray.init(
        num_cpus=args.num_cpus,
        include_dashboard=False,
        # Replicas import `deployments` from this checkout even when it is not installed as a package.
        runtime_env={
            "env_vars": {
                "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
                **PROXY_ENV,
                **(LOCAL_DIRECT_INGRESS_ENV if args.direct_ingress else {}),
            }
        },
    )
    check_resources(apps, ray.cluster_resources().get("CPU", 0.0))
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        serve.start(http_options=config.get("http_options", {}), grpc_options=config.get("grpc_options", {}))
        for app in apps:
            serve.run(build_app(app["args"]), name=app["name"], route_prefix=app.get("route_prefix", "/"))
        http_port = config.get("http_options", {}).get("port", 8000)
        grpc_port = config.get("grpc_options", {}).get("port", 9000)
        http_url, grpc_target = f"http://localhost:{http_port}", f"localhost:{grpc_port}"
        if args.direct_ingress:  # each app's ingress replicas listen on ports of their own
            direct = {app["name"]: wait_for_endpoints(app["name"], replicas=1) for app in apps}
            for name, found in direct.items():
                print(f"[serve] {name}: direct ingress HTTP {found.http}, gRPC {found.grpc}", flush=True)
            http_url, grpc_target = direct[apps[0]["name"]].http[0], direct[apps[0]["name"]].grpc[0]
        model = apps[0]["args"].get("served_model_name") or Path(apps[0]["args"]["model"]).resolve().name
        print(f"[serve] ready in {time.monotonic() - started:.1f}s", flush=True)
        if args.demo:
            from deployments import demo

            return demo.main(["--grpc", grpc_target, "--http", http_url])
        print(usage(http_port, grpc_port, model), flush=True)
        stop.wait()
        print("[serve] shutting down", flush=True)
        return 0
    finally:
        serve.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    sys.exit(main())
