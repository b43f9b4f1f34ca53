"""Multi-node Ray, for real, on one machine: a head and three worker nodes of one Ray cluster, each a
raylet with its own resources, serving the app that build_app builds.

The nodes are shaped like a KubeRay cluster's pods: the head offers one CPU (the ingress runs there,
beside the HeadOnly proxy) and no target slot; each worker offers one `target_slot` and no CPU, so
target replicas land only on workers, one per worker, as one-GPU pods hold one replica each.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from dataclasses import dataclass

import openai
import pytest
import ray
from ray import serve
from ray.cluster_utils import Cluster
from ray.serve.schema import ServeInstanceDetails
from serving import MODEL_NAME, REPO, Traffic, app_args, free_port, ray_released, wait_until

import dspark_client
from deployments.app import GRPC_SERVICERS, build_app
from deployments.replicas import routing_stats

pytestmark = pytest.mark.slow

SLOT = "target_slot"
# The GCS declares a silent raylet dead after ~1.5 s instead of ~30 s.
HEALTH_CHECKS = {
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 500,
    "health_check_timeout_ms": 500,
    "health_check_failure_threshold": 3,
}
OBJECT_STORE = 80 * 2**20  # bytes per node
PROMPT = "def wrap(text, width):"
GREEDY = dict(temperature=0.0, max_tokens=24, ignore_eos=True)


@dataclass
class Multi:
    cluster: Cluster
    workers: list  # ray._private.node.Node of each worker
    head_id: str
    http_url: str
    grpc_target: str

    def worker(self, node_id: str):
        return next(w for w in self.workers if w.node_id == node_id)


@pytest.fixture(scope="module")
def multi():
    with ray_released():
        cluster = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": 1,
                "include_dashboard": False,
                "object_store_memory": OBJECT_STORE,
                "_system_config": HEALTH_CHECKS,
            },
        )
        try:
            workers = [
                cluster.add_node(num_cpus=0, resources={SLOT: 1}, object_store_memory=OBJECT_STORE)
                for _ in range(3)
            ]
            cluster.wait_for_nodes()
            ray.init(
                address=cluster.address,
                log_to_driver=False,
                runtime_env={"env_vars": {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}},
            )
            http_port, grpc_port = free_port(), free_port()
            serve.start(
                proxy_location="HeadOnly",
                http_options={"host": "127.0.0.1", "port": http_port},
                grpc_options={"port": grpc_port, "grpc_servicer_functions": GRPC_SERVICERS},
            )
            yield Multi(
                cluster,
                workers,
                cluster.head_node.node_id,
                f"http://127.0.0.1:{http_port}",
                f"127.0.0.1:{grpc_port}",
            )
        finally:
            if ray.is_initialized():
                serve.shutdown()
                ray.shutdown()
            cluster.shutdown()


def replica_details(app: str, deployment: str) -> list:
    """The deployment's replicas as the Serve controller sees them (ReplicaDetails)."""
    # What `serve status -v` shows; ray.serve exports no public call for it without the dashboard.
    from ray.serve.context import _get_global_client

    details = ServeInstanceDetails(**_get_global_client().get_serve_details())
    return details.applications[app].deployments[deployment].replicas


def replicas(app: str, deployment: str) -> dict[str, tuple[str, str]]:
    """replica id -> (state, node id), from the Serve controller's own view."""
    return {r.replica_id: (r.state.value, r.node_id) for r in replica_details(app, deployment)}


def replica_pid(app: str, deployment: str, replica_id: str) -> int:
    """The process of one replica (the test cluster's nodes all run on this machine)."""
    (pid,) = [r.pid for r in replica_details(app, deployment) if r.replica_id == replica_id]
    return pid


def running(app: str, deployment: str) -> dict[str, str]:
    """replica id -> node id of the RUNNING replicas."""
    return {rid: node for rid, (state, node) in replicas(app, deployment).items() if state == "RUNNING"}


@pytest.fixture(scope="module")
def spread_app(multi, qwen3_dir):
    args = app_args(qwen3_dir, num_replicas=2, replica_num_cpus=0, ingress_num_cpus=0.25)
    serve.run(build_app({**args, "replica_resources": {SLOT: 1}}), name="spread", route_prefix="/")
    yield "spread"
    serve.delete("spread")


def test_replicas_spread_over_workers_and_both_surfaces_answer_from_the_head(multi, spread_app, qwen3_dir):
    targets = running(spread_app, "TargetReplica")
    assert len(targets) == 2 and len(set(targets.values())) == 2  # one replica per worker
    assert set(targets.values()) <= {w.node_id for w in multi.workers}
    assert set(running(spread_app, "Ingress").values()) == {multi.head_id}

    with dspark_client.Client(multi.grpc_target, application=spread_app, timeout_s=60) as client:
        over_grpc = [client.generate(PROMPT, **GREEDY).text for _ in range(4)]
    http = openai.OpenAI(base_url=multi.http_url + "/v1", api_key="-", max_retries=0, timeout=60)
    over_http = [
        http.completions.create(
            model=MODEL_NAME, prompt=PROMPT, max_tokens=24, temperature=0, extra_body={"ignore_eos": True}
        )
        .choices[0]
        .text
        for _ in range(4)
    ]
    assert over_grpc[0] and set(over_grpc + over_http) == {over_grpc[0]}  # one answer, whichever replica


def test_tensor_parallel_shards_pack_on_one_worker(multi, spread_app, qwen3_dir):
    """TP=2: the replica and its second shard take the two bundles of one STRICT_PACK placement group,
    which only the one worker still free can hold; it answers as the TP=1 replicas do."""
    args = app_args(
        qwen3_dir, num_replicas=1, tensor_parallel_size=2, replica_num_cpus=0, ingress_num_cpus=0.25
    )
    serve.run(build_app({**args, "replica_resources": {SLOT: 0.5}}), name="tp", route_prefix="/tp")
    try:
        (tp_node,) = running("tp", "TargetReplica").values()
        groups = [
            g
            for g in ray.util.placement_group_table().values()
            if g["state"] == "CREATED" and g["strategy"] == "STRICT_PACK"
        ]
        (group,) = groups
        assert len(group["bundles"]) == 2
        assert set(group["bundles_to_node_id"].values()) == {tp_node}
        assert tp_node not in running(spread_app, "TargetReplica").values()

        with (
            dspark_client.Client(multi.grpc_target, application=spread_app, timeout_s=60) as one,
            dspark_client.Client(multi.grpc_target, application="tp", timeout_s=60) as two,
        ):
            assert two.generate(PROMPT, **GREEDY).text == one.generate(PROMPT, **GREEDY).text
    finally:
        serve.delete("tp")
    wait_until(
        lambda: all(g["state"] == "REMOVED" for g in ray.util.placement_group_table().values()),
        timeout_s=60,
        what="the TP replica's placement group to be removed",
    )


def stream_or_ask_again(request: dict, cut: list, mid_stream: list):
    """A long greedy stream. One cut after tokens arrived cannot be retried by the SDK (it would repeat
    them): it surfaces, is kept in `cut`, and the client asks again with `generate`, whose own retries
    cover a request that had not started yet. A stream refused for room before its first token (the
    SDK's retries spent while capacity is halved) is overload, not a cut: the client asks again too.
    `mid_stream[0]` counts streams that have received tokens and not yet ended, so the test can kill the
    node while its streams are surely mid-flight."""
    lock = threading.Lock()

    def one(client) -> str:
        started = False
        try:
            with client.stream(PROMPT, **request) as stream:
                for _ in stream:
                    if not started:
                        started = True
                        with lock:
                            mid_stream[0] += 1
            return stream.completion.text
        except dspark_client.ResourceExhaustedError:
            if started:
                raise
            # Refused before its first token, as overload is (the survivor full while the lost replica
            # is replaced; the SDK's own retries spent): not a cut stream. Asked again, as for a cut.
            return client.generate(PROMPT, **request).text
        except dspark_client.DSparkClientError as error:
            cut.append(error)
            return client.generate(PROMPT, **request).text
        finally:
            if started:
                with lock:
                    mid_stream[0] -= 1

    return one


def running_requests(app: str, replica_id: str) -> int:
    stats = asyncio.run(routing_stats(app, "TargetReplica"))
    return next((s.get("running_requests", 0) for s in stats if s["replica_id"] == replica_id), 0)


def test_losing_a_worker_mid_load_replaces_its_replica_and_retries_succeed(multi, spread_app):
    # Long streams (300 tokens; 160 were not enough on a loaded machine: the victim's last requests could
    # finish between the check below and the node's death, so no stream was cut).
    request = dict(temperature=0.0, max_tokens=300, ignore_eos=True)
    with dspark_client.Client(multi.grpc_target, application=spread_app, timeout_s=120) as client:
        expected = client.generate(PROMPT, **request).text
    before = running(spread_app, "TargetReplica")
    ingress_before = running(spread_app, "Ingress")
    (victim_replica, victim_node), (survivor, survivor_node) = sorted(before.items())

    cut: list[Exception] = []  # streams that were in flight on the lost node
    mid_stream = [0]
    clients = 6
    retry = dspark_client.RetryPolicy(max_attempts=8, max_backoff_s=1.0)
    load = Traffic(
        multi.grpc_target,
        clients,
        stream_or_ask_again(request, cut, mid_stream),
        application=spread_app,
        retry=retry,
        timeout_s=120,
    )
    try:
        # Every client mid-stream and two of them on the victim: its requests have streamed tokens, so
        # losing them is an error the client sees (a request cut before its first token is retried).
        wait_until(
            lambda: mid_stream[0] == clients and running_requests(spread_app, victim_replica) >= 2,
            timeout_s=60,
            what="streams mid-flight on the replica about to be lost",
        )
        # A crash, not a drain: the raylet and every process of that node are killed at once. The local
        # cluster kills the node's raylet, and a worker can outlive it long enough to finish its streams
        # (on a fast machine no stream was cut), so the replica's process is killed first, as a real
        # node's crash takes it at the same instant.
        os.kill(replica_pid(spread_app, "TargetReplica", victim_replica), signal.SIGKILL)
        multi.cluster.remove_node(multi.worker(victim_node), allow_graceful=False)
        multi.workers.remove(multi.worker(victim_node))

        def replaced() -> bool:
            now = running(spread_app, "TargetReplica")
            return len(now) == 2 and victim_replica not in now

        wait_until(replaced, timeout_s=120, interval_s=0.5, what="Serve to replace the lost replica")
        served = len(load.texts)
        wait_until(lambda: len(load.texts) >= served + 6, timeout_s=120, what="requests after the recovery")
    finally:
        load.finish()

    after = running(spread_app, "TargetReplica")
    assert after[survivor] == survivor_node  # the other replica was never restarted
    (replacement_node,) = {node for rid, node in after.items() if rid != survivor}
    assert replacement_node in {w.node_id for w in multi.workers} and replacement_node != survivor_node
    assert running(spread_app, "Ingress") == ingress_before
    assert cut, "streams in flight on the lost node end with an error"
    assert all(isinstance(e, dspark_client.UnavailableError) for e in cut), cut  # retryable
    assert load.failures == []  # every request asked again succeeded
    assert set(load.texts) == {expected}  # nothing else disturbed: every answer intact
