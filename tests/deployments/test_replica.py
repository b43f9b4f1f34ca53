"""The target replica class in-process (no Ray): routing stats, admin, health check, graceful shutdown."""

from __future__ import annotations

import asyncio
import time

import pytest
from serving import ENGINE

from deployments.replica import TargetReplica
from deployments.replica_state import TauWindow
from dspark.errors import EngineDeadError, InvalidRequestError
from dspark.sampling_params import SamplingParams


@pytest.fixture
def replica(qwen3_dir):
    replica = TargetReplica.func_or_class(
        {"model": str(qwen3_dir), "engine": dict(ENGINE), "stuck_after_s": 5}
    )
    yield replica
    replica.__del__()


def prompt_ids(replica) -> list[int]:
    return replica.engine.engine.tokenize("def f(x):")


def test_routing_stats_and_tau_window(replica):
    async def run():
        before = await replica.record_routing_stats()
        params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
        events = [e async for e in replica.generate(prompt_ids(replica), params, "r1")]
        after = await replica.record_routing_stats()
        return before, events, after

    before, events, after = asyncio.run(run())
    assert before["running_requests"] == 0 and before["kv_headroom"] == 1.0
    assert sum(len(e.token_ids) for e in events) == 16 and events[-1].finish_reason == "length"
    assert (
        after["finished_requests"] == 1 and after["recent_tau"] == events[-1].speculation.mean_accept_length
    )
    assert after["draft_budget"]["max_step_tokens"] is None and after["healthy"]


def test_tau_window_keeps_its_value_when_idle():
    tau = TauWindow()
    assert tau.update(rounds=4, accepted=4) == 2.0
    assert tau.update(rounds=4, accepted=4) == 2.0  # idle: unchanged
    assert tau.update(rounds=6, accepted=4) == 1.0  # two rounds, nothing accepted


def test_set_draft_budget_while_serving(replica):
    async def run():
        budget = await replica.set_draft_budget({"max_request_tokens": 1, "max_step_tokens": 8})
        state = await replica.get_state()
        with pytest.raises(InvalidRequestError) as err:
            await replica.set_draft_budget({"max_request_tokens": -1})
        with pytest.raises(InvalidRequestError) as unknown:
            await replica.set_draft_budget({"tokens_per_moon": 3})
        return budget, state, err.value.field, unknown.value.field

    budget, state, field, unknown = asyncio.run(run())
    assert budget["max_request_tokens"] == 1 and state["draft_budget"]["max_step_tokens"] == 8
    assert state["engine"]["draft_budget"]["max_request_tokens"] == 1
    assert field == "max_request_tokens" and unknown == "tokens_per_moon"


def test_health_check_fails_when_the_loop_is_stuck(replica):
    replica.check_health()
    engine = replica.engine
    # A loop that has work but made no progress for longer than stuck_after_s.
    engine.engine.has_unfinished = lambda: True
    engine.last_progress = time.monotonic() - 60
    with pytest.raises(RuntimeError, match="stuck"):
        replica.check_health()


def test_shutdown_fails_in_flight_requests_explicitly(replica):
    async def run():
        params = SamplingParams(temperature=1.0, max_tokens=480, ignore_eos=True)
        stream = replica.generate(prompt_ids(replica), params, "long")
        await stream.__anext__()
        replica.__del__()  # what Serve calls once graceful_shutdown_timeout_s ran out
        with pytest.raises(EngineDeadError):
            async for _ in stream:
                pass

    asyncio.run(run())
    with pytest.raises(RuntimeError, match="dead or stuck"):
        replica.check_health()


def test_events_merge_keeps_every_token():
    from deployments.events import StreamEvent
    from dspark.outputs import SpeculationStats

    a = StreamEvent("r", "ab", (1, 2), False, None, 3, 2, SpeculationStats(1, 1, 1, 2.0))
    b = StreamEvent("r", "c", (3,), True, "stop", 3, 3, SpeculationStats(2, 2, 1, 1.5))
    merged = a.then(b)
    assert (merged.text, merged.token_ids, merged.finish_reason, merged.completion_tokens) == (
        "abc",
        (1, 2, 3),
        "stop",
        3,
    )
    assert merged.speculation == b.speculation
