"""engine_by_rank through a real Ray Serve rolling update and a crash: the pool ends on the configured mix.

Serve starts each new replica before the old one it replaces has stopped and released its rank, so
the first new replica comes up on rank 2; once the old replicas are gone Serve makes the ranks
contiguous again and tells the moved replica through `reconfigure(rank=...)`, which rebuilds its
engine (deployments/replica_engine.py). Made deterministic here: the old replicas take at least
`graceful_shutdown_wait_loop_s` (6 s) to stop, against ~3 s for a new replica to get its rank, and
rank 2 has an engine of its own (7 sequences), so whichever old replica Serve stops first, the
replica that started on rank 2 must rebuild to end on rank 0's or rank 1's engine.

A target-only app (no ingress): its replicas' stats are read from the actors themselves.
"""

from __future__ import annotations

import asyncio

import pytest
import ray
from ray import serve
from serving import ENGINE, app_args, wait_until

from deployments import replicas
from deployments.app import ROUTING_FIELDS
from deployments.config import AppConfig
from deployments.replica import TargetReplica

APP = "ranked"
# Rank 0: ENGINE's 8 sequences, rank 1: 6; rank 2 (only ever held during a rollout): 7.
BY_RANK = [{}, {"max_num_seqs": 6}, {"max_num_seqs": 7}]


def ranked_app(model_dir, **overrides):
    config = AppConfig(**app_args(model_dir, engine_by_rank=BY_RANK, **overrides))
    return TargetReplica.options(
        num_replicas=2,
        graceful_shutdown_wait_loop_s=6.0,
        graceful_shutdown_timeout_s=10.0,
        health_check_period_s=1.0,
        ray_actor_options={"num_cpus": config.replica_num_cpus},
    ).bind(config.model_dump(exclude=ROUTING_FIELDS))


def stats() -> dict[str, dict]:
    return {s["replica_id"]: s for s in asyncio.run(replicas.routing_stats(APP, "TargetReplica"))}


def pool(snapshot: dict[str, dict]) -> dict[int, int]:
    """engine rank -> max_num_seqs of the replicas up (-1: a replica not serving yet)."""
    return {s.get("engine_rank", -1): s.get("max_num_seqs", -1) for s in snapshot.values()}


@pytest.fixture
def ranked(serve_stack):
    serve.run(ranked_app(serve_stack.model_dir), name=APP, route_prefix=None)
    yield
    serve.delete(APP)


@pytest.mark.slow  # about 65 s on two busy cores: an app start, a rolling update, a replacement
def test_a_rolling_update_ends_with_every_rank_on_its_own_engine(ranked, serve_stack):
    before = wait_until(lambda: len(stats()) == 2 and stats(), what="the first replicas")
    assert pool(before) == {0: ENGINE["max_num_seqs"], 1: 6}
    # A changed config: Serve replaces every replica, one at a time.
    serve.run(ranked_app(serve_stack.model_dir, stuck_after_s=31.0), name=APP, route_prefix=None)

    seen: list[dict] = []

    def settled():
        now = stats()
        seen.append(pool(now))
        replaced = len(now) == 2 and not set(now) & set(before)
        return replaced and sorted(pool(now)) == [0, 1] and all(s["healthy"] for s in now.values()) and now

    try:
        after = wait_until(settled, timeout_s=120, what="the new replicas on ranks 0 and 1")
    except AssertionError as timeout:
        raise AssertionError(f"{timeout}; last pool (engine rank -> max_num_seqs): {seen[-1]}") from None
    assert pool(after) == {0: ENGINE["max_num_seqs"], 1: 6}
    # The replica that started on rank 2 built its engine twice; the other one once.
    assert sorted(s["engine_builds"] for s in after.values()) == [1, 2]

    # A crash: Serve replaces the replica of rank 1, and the pool comes back to the same mix.
    (victim,) = [rid for rid, s in after.items() if s["engine_rank"] == 1]
    (name,) = [n for n in replicas.replica_actor_names(APP, "TargetReplica") if n.endswith(f"#{victim}")]
    ray.kill(ray.get_actor(name, namespace=replicas.SERVE_NAMESPACE))

    def recovered():
        now = stats()
        back = len(now) == 2 and victim not in now and all(s.get("healthy") for s in now.values())
        return back and pool(now) == {0: ENGINE["max_num_seqs"], 1: 6}

    wait_until(recovered, timeout_s=120, what="a replacement on rank 1's engine")
