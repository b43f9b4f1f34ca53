"""A target replica whose Serve rank changes (deployments/replica_engine.py), in-process (no Ray): it
rebuilds its engine when the new rank's engine differs, after the requests running have finished (or,
past graceful_shutdown_timeout_s, been aborted), refuses new ones meanwhile with a retry hint, and keeps
its engine when the new rank's is the same. Serve's own calls are tested in tests/router."""

from __future__ import annotations

import asyncio
import threading

import pytest
from ray.serve.schema import ReplicaRank
from serving import ENGINE, decoded

from deployments.replica import TargetReplica
from dspark.errors import AdmissionError
from dspark.sampling_params import SamplingParams

BY_RANK = [{}, {"max_num_seqs": 6}]  # rank 0: ENGINE's 8 sequences; rank 1: 6
PARAMS = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)


def rank(r: int) -> ReplicaRank:
    return ReplicaRank(rank=r, node_rank=0, local_rank=r)


@pytest.fixture
def replica(qwen3_dir):
    # Outside Serve the replica starts as rank 0.
    replica = TargetReplica.func_or_class(
        {
            "model": str(qwen3_dir),
            "engine": dict(ENGINE),
            "engine_by_rank": BY_RANK,
            "torch_num_threads": 1,
            "graceful_shutdown_timeout_s": 30.0,
        }
    )
    yield replica
    replica.__del__()


def stall(replica) -> threading.Event:
    """From now on the engine's next step blocks until the returned event is set."""
    release = threading.Event()
    engine = replica.engine.engine
    step = engine.step

    def stalled():
        release.wait()
        return step()

    engine.step = stalled
    return release


async def poll(predicate, what: str, bound_s: float = 30.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + bound_s
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


async def running_request(replica) -> asyncio.Task:
    """A greedy request of 16 tokens, admitted by the engine when this returns."""
    prompt = replica.engine.engine.tokenize("def f(x):")
    task = asyncio.get_running_loop().create_task(collect(replica.generate(prompt, PARAMS, "old")))
    await poll(replica.engine.engine.has_unfinished, "the request admitted")
    return task


async def collect(stream) -> list:
    return [event async for event in decoded(stream)]


def test_a_new_rank_with_another_engine_rebuilds_it_after_the_running_request_finished(replica):
    async def run():
        old_engine = replica.engine
        release = stall(replica)
        old = await running_request(replica)
        reconfigured = asyncio.get_running_loop().create_task(replica.reconfigure(None, rank(1)))
        await poll(lambda: replica._rebuilding is not None, "the rebuild to start")
        with pytest.raises(AdmissionError) as refused:
            await collect(replica.generate([5, 6, 7], PARAMS, "new"))
        assert not old.done()  # the running request holds the old engine: nothing is stopped yet
        release.set()
        await reconfigured
        stats = await replica.record_routing_stats()
        after = await collect(replica.generate([5, 6, 7], PARAMS, "after"))
        return old_engine, await old, refused.value, stats, after

    old_engine, old_events, refused, stats, after = asyncio.run(run())
    # The request running on the old engine ended normally, with all its tokens.
    assert sum(len(e.token_ids) for e in old_events) == 16
    assert (old_events[-1].finished, old_events[-1].finish_reason) == (True, "length")
    assert "rebuilding its engine for Serve rank 1" in refused.reason and refused.retry_after_s >= 1.0
    assert replica.engine is not old_engine and not old_engine.is_healthy()
    assert (stats["max_num_seqs"], stats["engine_rank"], stats["engine_builds"], stats["healthy"]) == (
        6,
        1,
        2,
        True,
    )
    assert sum(len(e.token_ids) for e in after) == 16  # the new engine serves
    replica.check_health()


def test_past_the_graceful_timeout_the_running_requests_are_aborted(replica):
    replica.config = replica.config.model_copy(update={"graceful_shutdown_timeout_s": 0.2})

    async def run():
        release = stall(replica)
        old = await running_request(replica)
        reconfigured = asyncio.get_running_loop().create_task(replica.reconfigure(None, rank(1)))
        events = await asyncio.wait_for(old, 30.0)  # aborted while the engine is still stalled
        release.set()
        await reconfigured
        return events, await replica.record_routing_stats()

    events, stats = asyncio.run(run())
    assert (events[-1].finished, events[-1].finish_reason) == (True, "abort")
    assert (stats["max_num_seqs"], stats["engine_builds"]) == (6, 2)


def test_a_new_rank_with_the_same_engine_keeps_it(replica):
    engine = replica.engine

    async def run():
        await replica.reconfigure(None, rank(2))  # 2 % 2: rank 0's engine again
        return await replica.record_routing_stats()

    stats = asyncio.run(run())
    assert replica.engine is engine and replica._rebuilding is None
    assert (stats["max_num_seqs"], stats["engine_rank"], stats["engine_builds"]) == (8, 2, 1)
