"""A real Ray Serve stack for the serving tests, started once per session and shared by tests/deployments,
tests/sdk and tests/docs (each conftest imports `serve_stack`; the last user shuts Ray down).

Small on purpose: 2 logical CPUs, a small object store, no dashboard; replicas use one torch thread.
It runs two ingress replicas (what Abort and duplicate ids are tested across) and serves the tiny
test checkpoint under the name "target", the name the demo stack and the README's examples use.
"""

from __future__ import annotations

import os
import random
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
APP = "dspark"
MODEL_NAME = "target"
INGRESS_REPLICAS = 2
# Shared by the offline comparisons: the engine options every served replica uses.
ENGINE = {
    "drafter": "ngram",
    "num_speculative_tokens": 4,
    "scheduler": "fixed",
    "num_kv_pages": 128,
    "max_num_seqs": 8,
    # The SLA router's replicas profile SPS(B) at start when the engine has no table: coarsely here.
    "cost_table_profile": "coarse",
}


@dataclass
class Stack:
    http_url: str  # http://127.0.0.1:PORT
    grpc_target: str  # 127.0.0.1:PORT
    model_dir: Path
    model_name: str


_state: dict = {"users": 0, "stack": None}


# Ports for the tests' servers: above Ray's worker ports (10002-19999 by default) and below the kernel's
# ephemeral range (32768+ on Linux). A port the kernel hands out for port 0 is ephemeral, and any
# process's next outgoing connection or bind(0) may take it before the test's server binds it (a
# telemetry test met that in CI); ports here are only ever taken by an explicit bind.
TEST_PORTS = (20000, 32000)
_pick = random.SystemRandom()  # not the seeded `random`: two test runs at once must not pick alike


def free_port() -> int:
    """A port on which nothing listens now, from TEST_PORTS."""
    for _ in range(1000):
        port = _pick.randint(*TEST_PORTS)
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {TEST_PORTS}")


def wait_until(predicate, timeout_s: float = 60.0, interval_s: float = 0.1, what: str = "condition"):
    """Poll `predicate` until it returns something truthy; fail after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(interval_s)


async def decoded(stream: AsyncIterator) -> AsyncIterator:
    """A target replica's `generate` called in-process, as the ingress reads it: StreamEvents."""
    from deployments.events import received

    async with aclosing(stream):
        async for item in stream:
            yield received(item)


def app_args(model_dir: Path, **overrides) -> dict:
    return {
        "model": str(model_dir),
        "served_model_name": MODEL_NAME,
        "engine": dict(ENGINE),
        "num_replicas": 2,
        "num_ingress_replicas": 1,  # the extra apps some tests deploy stay light; the shared one has 2
        "replica_num_cpus": 0.25,
        "ingress_num_cpus": 0.25,
        "torch_num_threads": 1,
        "max_request_bytes": 64 * 1024,
        "health_check_period_s": 1.0,
        "graceful_shutdown_timeout_s": 2.0,
        **overrides,
    }


def _start(
    model_dir: Path, http_port: int | None = None, grpc_port: int | None = None, **app_overrides
) -> Stack:
    import ray
    from ray import serve

    from deployments.app import GRPC_SERVICERS, build_app

    http_port, grpc_port = http_port or free_port(), grpc_port or free_port()
    # Serve's controller kills a proxy not ready within 5 s, which a loaded 2-core machine can miss; the
    # controller (a Ray worker) inherits this process's environment.
    os.environ.setdefault("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "60")
    os.environ.setdefault("RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S", "60")
    ray.init(
        address="local",  # always a cluster of our own, never one some other process started here
        num_cpus=2,
        object_store_memory=100 * 2**20,
        include_dashboard=False,
        log_to_driver=False,
        # Replica processes import `deployments` from the checkout, installed or not.
        runtime_env={"env_vars": {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}},
    )
    serve.start(
        http_options={"host": "127.0.0.1", "port": http_port},
        grpc_options={"port": grpc_port, "grpc_servicer_functions": GRPC_SERVICERS},
    )
    app = app_args(model_dir, **{"num_ingress_replicas": INGRESS_REPLICAS, **app_overrides})
    serve.run(build_app(app), name=APP, route_prefix="/")
    return Stack(f"http://127.0.0.1:{http_port}", f"127.0.0.1:{grpc_port}", model_dir, MODEL_NAME)


def _start_with_retry(model_dir: Path, attempts: int = 2, **options) -> Stack:
    """Start the stack; on a loaded 2-core machine Serve's controller can give up on a slow proxy
    actor, so a failed start is torn down completely (never left half-initialised) and tried again."""
    import ray
    from ray import serve

    for attempt in range(1, attempts + 1):
        try:
            return _start(model_dir, **options)
        except Exception:
            if ray.is_initialized():
                serve.shutdown()
                ray.shutdown()
            if attempt == attempts:
                raise
    raise AssertionError("unreachable")


@pytest.fixture(scope="session")
def serve_stack(qwen3_dir):
    if _state["stack"] is None:
        _state["stack"] = _start_with_retry(qwen3_dir)
    _state["users"] += 1
    yield _state["stack"]
    _state["users"] -= 1
    if _state["users"] == 0:
        import ray
        from ray import serve

        serve.shutdown()
        ray.shutdown()
        _state["stack"] = None


class Traffic:
    """Client threads calling `request(client)` in a loop until finished; each thread has its own
    dspark_client.Client(target, **client_options). Returned texts and raised errors are all kept."""

    def __init__(self, target: str, clients: int, request: Callable, **client_options) -> None:
        self.stop = threading.Event()
        self.texts: list[str] = []
        self.failures: list[Exception] = []
        self.threads = [
            threading.Thread(target=self._loop, args=(target, request, client_options))
            for _ in range(clients)
        ]
        for thread in self.threads:
            thread.start()

    def _loop(self, target: str, request: Callable, client_options: dict) -> None:
        import dspark_client

        with dspark_client.Client(target, **client_options) as client:
            while not self.stop.is_set():
                try:
                    self.texts.append(request(client))
                except Exception as exc:
                    self.failures.append(exc)

    def finish(self, timeout_s: float = 180.0) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=timeout_s)
        assert not any(t.is_alive() for t in self.threads)


@contextmanager
def ray_released():
    """For tests that start a Ray cluster of their own (one Ray per process): the shared stack, if it
    runs, stops meanwhile and comes back afterwards on the same ports, so fixtures holding its
    addresses keep working."""
    stack = _state["stack"]
    if stack is None:
        yield
        return
    import ray
    from ray import serve

    serve.shutdown()
    ray.shutdown()
    try:
        yield
    finally:
        port = lambda address: int(address.rsplit(":", 1)[1])
        _state["stack"] = _start_with_retry(
            stack.model_dir, http_port=port(stack.http_url), grpc_port=port(stack.grpc_target)
        )


@contextmanager
def own_stack(model_dir: Path, env: dict[str, str] | None = None, **app_overrides):
    """A Ray and Serve stack of the test's own, while the shared one steps aside. `env` is set in this
    process while it starts, so every Ray process inherits it (as `VAR=... make serve` does), and
    unset before the shared stack comes back; `app_overrides` go to the app's args."""
    import ray
    from ray import serve

    with ray_released(), pytest.MonkeyPatch.context() as patch:
        for name, value in (env or {}).items():
            patch.setenv(name, value)
        stack = _start_with_retry(model_dir, **app_overrides)
        try:
            yield stack
        finally:
            serve.shutdown()
            ray.shutdown()


def call_on_replica(actor_name: str, method: str, *args, stream: bool = False):
    """Call `method` of one chosen Serve replica, past the router that would pick one itself.

    Test-only, through Serve's private actor entry points (`handle_request[_streaming]` with a pickled
    RequestMetadata, as Serve's own handles send): the way to make two calls land on two known
    ingress replicas. Returns an ObjectRef, or an ObjectRefGenerator when `stream`.
    """
    import pickle
    import uuid

    import ray
    from ray.serve._private.common import RequestMetadata

    from deployments.replicas import SERVE_NAMESPACE

    rid = uuid.uuid4().hex
    meta = RequestMetadata(
        request_id=rid, internal_request_id=rid, call_method=method, app_name=APP, is_streaming=stream
    )
    actor = ray.get_actor(actor_name, namespace=SERVE_NAMESPACE)
    if stream:
        return actor.handle_request_streaming.options(num_returns="streaming").remote(
            pickle.dumps(meta), *args
        )
    return actor.handle_request.remote(pickle.dumps(meta), *args)
