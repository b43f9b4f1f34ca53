"""Direct ingress: the Ingress replicas serve HTTP and gRPC themselves, with no Serve proxy in between.

Behind Serve's proxy a streamed message crosses two Ray hops (target replica -> ingress -> proxy) before
it reaches the client; with `RAY_SERVE_ENABLE_DIRECT_INGRESS=1` (Ray Serve 2.60) every replica of an
app's ingress deployment runs its own HTTP (uvicorn, the same FastAPI app) and gRPC server (the same
servicer functions), so the proxy's hop and its process' CPU per token go away. It is a cluster-wide
switch: the Serve controller and the ingress replicas read it when they start, so it goes in
`ray.init`'s runtime_env (`make serve --direct-ingress`, `bench/serve.py --direct-ingress`) or in every
Ray container's environment, never in an app's options.

Each ingress replica gets ports of its own from Serve's controller (HTTP from
RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT, 30000 by default; gRPC from ..._MIN_GRPC_PORT, 40000), listed as
the app's target groups for a load balancer; the proxy on the head node's configured ports stays up as
the fallback (Serve's own "HeadOnly" placement) and still serves the app through the handle path.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

DIRECT_INGRESS_ENV = {"RAY_SERVE_ENABLE_DIRECT_INGRESS": "1"}
# On one machine whose clients call the replicas' ports themselves no load balancer has to notice that
# a replica stops: Serve's 30 s minimum drain (35 s with its buffer, on every shutdown) only slows
# `make serve`'s Ctrl-C, the tests and the benchmarks.
LOCAL_DIRECT_INGRESS_ENV = {**DIRECT_INGRESS_ENV, "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "0"}


@dataclass(frozen=True)
class Endpoints:
    """Where an app's ingress replicas listen: `http` as base URLs, `grpc` as host:port targets."""

    http: tuple[str, ...]
    grpc: tuple[str, ...]


def endpoints_of(target_groups: list[dict], app_name: str, host: str | None = None) -> Endpoints:
    """The app's ingress replicas' addresses from Serve's target groups (ServeInstanceDetails'
    `target_groups`, as dicts; without direct ingress they name the proxies, under no app). A target
    names its node's IP; `host` replaces it where the servers bind one address only (Serve's
    http_options.host, e.g. 127.0.0.1)."""
    found: dict[str, list[str]] = {"http": [], "grpc": []}
    for group in target_groups:
        protocol = str(group["protocol"]).lower().rpartition(".")[2]
        if group.get("app_name") != app_name or protocol not in found:
            continue
        for target in group["targets"]:
            address = f"{host or target['ip']}:{target['port']}"
            found[protocol].append(f"http://{address}" if protocol == "http" else address)
    return Endpoints(tuple(sorted(found["http"])), tuple(sorted(found["grpc"])))


def wait_for_endpoints(
    app_name: str, replicas: int, host: str | None = None, timeout_s: float = 60.0
) -> Endpoints:
    """The app's ingress endpoints once `replicas` of them listen on both surfaces (a replica is
    listed once its servers have started, a little after Serve reports the app running)."""
    from ray.serve.context import _get_global_client

    client = _get_global_client()
    deadline = time.monotonic() + timeout_s
    while True:
        details = client.get_serve_details()
        found = endpoints_of(details.get("target_groups", []), app_name, host)
        if len(found.http) >= replicas and len(found.grpc) >= replicas:
            return found
        if time.monotonic() > deadline:
            raise TimeoutError(f"direct ingress of app {app_name!r}: only {found} after {timeout_s:g}s")
        time.sleep(0.2)
