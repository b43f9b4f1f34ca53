"""The target replica class in-process (no Ray): routing stats, admin, health check, graceful shutdown,
and a stalled or broken engine: reported by the health check, answered within deadlines, no threads."""

from __future__ import annotations

import asyncio
import os
import pickle
import threading
import time

import pytest
from ray import cloudpickle
from serving import ENGINE, decoded, wait_until

from deployments import running, thread_policy
from deployments.events import StreamEvent, coalesce, coalesce_interval, received
from deployments.grpc_api import _final
from deployments.replica import TargetReplica
from deployments.replica_state import RecentForwards, RecentRounds
from dspark.errors import EngineDeadError, InvalidRequestError
from dspark.outputs import SpeculationStats
from dspark.prefix_cache import cached_prefix_tokens
from dspark.sampling_params import SamplingParams
from dspark_client.types import CompletionBuilder, Usage


def make_replica(model_dir, stuck_after_s: float = 5.0) -> TargetReplica:
    return TargetReplica.func_or_class(
        {"model": str(model_dir), "engine": dict(ENGINE), "stuck_after_s": stuck_after_s}
    )


@pytest.fixture
def replica(qwen3_dir):
    replica = make_replica(qwen3_dir)
    yield replica
    replica.__del__()


def test_a_replica_called_outside_serve_leaves_its_callers_threads_alone(replica):
    # serving_thread_policy defaults to batch, which a Serve replica applies to its own process; called
    # directly, the class shares its caller's process and must not change any of its threads (the caller
    # here is pytest's process, whose every thread starts normal).
    assert replica.config.serving_thread_policy == "batch"
    policies = {tid: os.sched_getscheduler(tid) for tid in thread_policy.threads()}
    assert replica.engine.thread_id in policies
    assert set(policies.values()) == {thread_policy.SCHED_OTHER}


def prompt_ids(replica) -> list[int]:
    return replica.engine.engine.tokenize("def f(x):")


def stall(replica) -> threading.Event:
    """From now on the engine's next step blocks until the returned event is set."""
    release = threading.Event()
    step = replica.engine.engine.step

    def stalled():
        release.wait()
        return step()

    replica.engine.engine.step = stalled
    return release


async def stream_in_background(replica, request_id: str) -> asyncio.Task:
    """Start a greedy request and return once the engine has admitted it (the next step runs it)."""
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)

    async def consume():
        return [e async for e in decoded(replica.generate(prompt_ids(replica), params, request_id))]

    task = asyncio.get_running_loop().create_task(consume())
    for _ in range(500):
        if replica.engine.engine.has_unfinished():
            return task
        await asyncio.sleep(0.01)
    raise AssertionError("the request was never admitted")


def test_routing_stats_and_tau_window(replica):
    replica._recent.min_rounds = 1  # one short request's rounds close the decode window

    async def run():
        before = await replica.record_routing_stats()
        start = forward_counters()
        params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
        events = [e async for e in decoded(replica.generate(prompt_ids(replica), params, "r1"))]
        after = await replica.record_routing_stats()
        return before, start, events, after

    def forward_counters() -> tuple[int, int, float]:
        stats = replica.engine.engine.stats
        return stats.steps, stats.forward_tokens, stats.forward_time_s

    before, start, events, after = asyncio.run(run())
    assert before["running_requests"] == 0 and before["kv_headroom"] == 1.0
    assert sum(len(e.token_ids) for e in events) == 16 and events[-1].finish_reason == "length"
    assert (
        after["finished_requests"] == 1 and after["recent_tau"] == events[-1].speculation.mean_accept_length
    )
    assert after["draft_budget"]["max_step_tokens"] is None and after["healthy"]
    # The forwards of that request, measured: the router scales the SPS table by them.
    steps, tokens, seconds = (now - then for now, then in zip(forward_counters(), start))
    assert steps >= RecentForwards.min_steps  # a prefill and the rounds of 16 tokens
    assert after["recent_forward_tokens"] == round(tokens / steps, 2)
    assert after["recent_forward_sps"] == round(steps / seconds, 3)
    assert "steps" not in after and "forward_tokens" not in after
    # Its decode steps as it waited for them: the router calibrates its TPOT by these.
    stats = replica.engine.engine.stats
    assert "recent_round_s" not in before  # nothing decoded yet: nothing published
    assert after["recent_round_s"] == round(stats.round_time_s / stats.rounds, 6) > 0
    assert after["recent_round_tokens"] == round(stats.round_tokens / stats.rounds, 2)
    assert after["recent_round_ts"] == after["ts"]
    # One request: each step's decode tokens are its anchor and the drafts it verified.
    assert stats.round_tokens == stats.rounds + stats.drafted_tokens


def test_recent_rounds_keep_their_values_when_idle():
    recent = RecentRounds()
    first = recent.update(4, accepted_tokens=4, drafted_tokens=8, step_time_s=3.0, forward_time_s=2.0)
    assert first == {"recent_tau": 2.0, "mean_verified": 2.0, "step_overhead": 1.5}
    assert recent.update(4, 4, 8, 3.0, 2.0) == first  # idle: unchanged
    # Two rounds, nothing accepted of 2 drafts; steps took as long as their forwards.
    assert recent.update(6, 4, 10, 4.0, 3.0) == {
        "recent_tau": 1.0,
        "mean_verified": 1.0,
        "step_overhead": 1.0,
    }


def test_recent_rounds_measure_the_decode_steps_wall_per_round_over_enough_rounds():
    recent = RecentRounds(min_rounds=8, half_life_s=2.0)
    speed = {"recent_tau": 2.0, "mean_verified": 2.0, "step_overhead": 1.5}
    assert recent.update(4, 4, 8, 3.0, 2.0, 0.4, 40, now=1.0) == speed  # 4 rounds: too few, not yet
    # 10 rounds in all waited 1.2 s of steps, 100 decode tokens of steps counted per round.
    first = recent.update(10, 10, 20, 4.0, 3.0, 1.2, 100, now=2.0)
    assert {k: first[k] for k in ("recent_round_s", "recent_round_tokens", "recent_round_ts")} == {
        "recent_round_s": 0.12,
        "recent_round_tokens": 10.0,
        "recent_round_ts": 2.0,
    }
    idle = recent.update(10, 10, 20, 4.0, 3.0, 1.2, 100, now=9.0)
    assert idle["recent_round_s"] == 0.12 and idle["recent_round_ts"] == 2.0  # idle: kept, with its time
    # 8 more rounds at 0.05 s and 4 tokens each: a new window, smoothed with the last over the 8 s since
    # (half-life 2 s: weight 1 - 1/16): 0.12 - 15/16 * 0.07 s and 10 - 15/16 * 6 tokens.
    after = recent.update(18, 10, 20, 5.0, 4.0, 1.6, 132, now=10.0)
    assert (after["recent_round_s"], after["recent_round_tokens"], after["recent_round_ts"]) == (
        0.054375,
        4.38,
        10.0,
    )
    # A window one half-life later moves it half-way.
    later = recent.update(26, 10, 20, 6.0, 5.0, 2.0, 164, now=12.0)
    assert later["recent_round_s"] == pytest.approx(0.054375 + 0.5 * (0.05 - 0.054375), abs=1e-6)


def test_recent_forwards_measure_the_forward_rate_at_its_mean_size():
    recent = RecentForwards(min_steps=4)
    assert recent.update(0, 0, 0.0) == {}  # nothing measured yet: nothing published
    assert recent.update(3, 300, 0.1) == {}  # too few forwards to tell: the window stays open
    # 10 forwards of 480 tokens in all took 0.5 s: 48 tokens each, 20 forwards per second.
    first = recent.update(10, 480, 0.5)
    assert first == {"recent_forward_tokens": 48.0, "recent_forward_sps": 20.0}
    assert recent.update(10, 480, 0.5) == first  # idle: unchanged
    assert recent.update(12, 484, 0.55) == first  # 2 forwards: not yet
    assert recent.update(14, 488, 0.6) == {"recent_forward_tokens": 2.0, "recent_forward_sps": 40.0}


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


def test_health_check_fails_while_the_loop_is_stuck_and_recovers(qwen3_dir):
    replica = make_replica(qwen3_dir, stuck_after_s=0.5)
    replica.check_health()

    def health_problem() -> str | None:
        try:
            replica.check_health()
        except RuntimeError as exc:
            return str(exc)
        return None

    async def run():
        release = stall(replica)
        task = await stream_in_background(replica, "stuck")
        # A loop with work but no step finished for longer than stuck_after_s.
        problem = wait_until(health_problem, timeout_s=5.0, interval_s=0.05, what="a failed health check")
        release.set()
        return problem, await task

    try:
        problem, events = asyncio.run(run())
        assert problem.startswith("replica unhealthy: engine loop stuck: no step finished for")
        assert sum(len(e.token_ids) for e in events) == 16
        replica.check_health()
    finally:
        replica.__del__()


def test_a_stalled_engine_costs_no_threads_and_stats_keep_their_deadline(replica):
    async def run():
        good = await replica.record_routing_stats()
        release = stall(replica)
        task = await stream_in_background(replica, "stalled")
        replica.stats_timeout_s = 0.05
        baseline, peak, readings, slowest = threading.active_count(), 0, [], 0.0
        for _ in range(60):
            start = time.monotonic()
            readings.append(await replica.record_routing_stats())
            slowest = max(slowest, time.monotonic() - start)
            peak = max(peak, threading.active_count())
        queued = replica.engine._inbox.qsize()  # one stats read waits behind the step, not 60
        release.set()
        events = await task
        replica.stats_timeout_s = 5.0
        return good, baseline, peak, readings, slowest, queued, events, await replica.record_routing_stats()

    good, baseline, peak, readings, slowest, queued, events, after = asyncio.run(run())
    print(f"threads: baseline {baseline}, peak {peak} over 60 calls; slowest call {slowest * 1e3:.0f} ms")
    assert peak <= baseline + 2 and queued == 1
    assert slowest < 1.0  # each call ends at its 0.05 s deadline (generous slack for a busy machine)
    assert all(r == {**good, "healthy": False} for r in readings)  # the last good reading, marked
    assert sum(len(e.token_ids) for e in events) == 16 and events[-1].finish_reason == "length"
    assert after["healthy"] and after["finished_requests"] == 1


def test_a_step_that_fails_for_no_one_request_makes_the_replica_unhealthy(replica):
    def device_lost(items, tap_layers=()):
        raise RuntimeError("device lost")

    replica.engine.engine.runner.forward = device_lost

    async def run():
        params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
        with pytest.raises(EngineDeadError, match="engine step failed: RuntimeError\\('device lost'\\)"):
            async for _ in decoded(replica.generate(prompt_ids(replica), params, "r1")):
                pass
        return await replica.record_routing_stats()

    stats = asyncio.run(run())
    assert not stats["healthy"]
    with pytest.raises(RuntimeError, match="replica unhealthy: engine step failed: RuntimeError"):
        replica.check_health()


def test_shutdown_fails_in_flight_requests_explicitly(replica):
    async def run():
        params = SamplingParams(temperature=1.0, max_tokens=480, ignore_eos=True)
        stream = decoded(replica.generate(prompt_ids(replica), params, "long"))
        await stream.__anext__()
        replica.__del__()  # what Serve calls once graceful_shutdown_timeout_s ran out
        with pytest.raises(EngineDeadError):
            async for _ in stream:
                pass

    asyncio.run(run())
    with pytest.raises(RuntimeError, match="replica unhealthy: engine loop dead: shut down"):
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


def _event(i: int, text: str, finished: bool = False) -> StreamEvent:
    """The delta of engine step i: one token, i + 1 generated so far."""
    return StreamEvent(
        "r",
        text,
        (100 + i,),
        finished,
        "length" if finished else None,
        3,
        i + 1,
        SpeculationStats(i, 0, 0, 1.0),
    )


def test_steps_that_piled_up_between_reads_travel_as_one_message_in_order():
    """Many engine steps between two reads of the consumer: one message carrying every token in order,
    its text the steps' texts concatenated (multi-byte characters included), the last step's totals."""
    texts = ["de", "f ", "f(", "x", "):", "\n    ", "ré", "", "sumé ✓"]
    steps = [_event(i, t) for i, t in enumerate(texts)]

    async def run():
        pending: asyncio.Queue = asyncio.Queue()
        for step in steps[1:]:
            pending.put_nowait(step)
        sent, held = coalesce(steps[0], pending)
        return sent, held, pending.empty()

    sent, held, drained = asyncio.run(run())
    assert held is None and drained
    assert sent.text == "".join(texts) == "def f(x):\n    résumé ✓"
    assert sent.token_ids == tuple(100 + i for i in range(len(steps)))
    assert (sent.completion_tokens, sent.speculation, sent.finished) == (
        len(steps),
        steps[-1].speculation,
        False,
    )


def test_a_consumer_that_keeps_up_gets_every_step_at_once_and_alone():
    async def run():
        pending: asyncio.Queue = asyncio.Queue()
        return coalesce(_event(0, "a"), pending)

    assert asyncio.run(run()) == (_event(0, "a"), None)


def test_coalescing_stops_at_the_last_step_and_holds_back_what_follows_tokens():
    """The finished step ends a message (usage and finish_reason are its own); an abort or an error
    queued behind tokens is acted on only after those tokens went out."""
    boom = RuntimeError("engine shut down")

    async def run():
        pending: asyncio.Queue = asyncio.Queue()
        for item in (_event(1, "b"), _event(2, "c", finished=True), _event(3, "late")):
            pending.put_nowait(item)
        finished = coalesce(_event(0, "a"), pending)
        behind: asyncio.Queue = asyncio.Queue()
        for item in (_event(1, "b"), boom, _event(2, "c")):
            behind.put_nowait(item)
        tokens, error = coalesce(_event(0, "a"), behind)
        # The held item is sent next as itself, merged with nothing: the queue keeps what follows it.
        return finished, pending.qsize(), (tokens, error), coalesce(error, behind), behind.qsize()

    (sent, held), left, (before_error, error), then, after = asyncio.run(run())
    assert (sent.text, sent.token_ids, sent.finished, sent.finish_reason, held) == (
        "abc",
        (100, 101, 102),
        True,
        "length",
        None,
    )
    assert sent.usage()["completion_tokens"] == 3 and left == 1
    assert (before_error.text, before_error.token_ids, error, after) == ("ab", (100, 101), boom, 1)
    assert then == (boom, None)


def test_an_event_travels_as_builtins_and_arrives_equal():
    """Ray pickles every streamed message: an event reduces to a flat tuple of builtins (no dataclass
    state for cloudpickle to walk) and unpickles equal, span attributes and speculation included."""
    spec = SpeculationStats(4, 20, 8, 3.0, proposed_tokens=21, accepted_by_position=(4, 3, 1))
    event = StreamEvent("r.k", "é", (7, 8), True, "stop", 5, 9, spec, 2, {"dspark.tau": 3.0})
    _, args = event.__reduce__()
    assert all(type(a) in (str, tuple, bool, int, dict) for a in args if a is not None)
    assert pickle.loads(cloudpickle.dumps(event)) == event
    assert pickle.loads(pickle.dumps(_event(0, "a"))) == _event(0, "a")


def test_an_event_travels_as_bytes_and_arrives_equal():
    """A target replica streams each event as bytes (Ray passes bytes through unserialized); the ingress
    reads them back equal, whatever the text (a lone surrogate too), and SGLang's event objects as is."""
    spec = SpeculationStats(4, 20, 8, 3.0, proposed_tokens=21, accepted_by_position=(4, 3, 1))
    attrs = {"dspark.tau": 3.0, "dspark.accepted_by_position": [4, 3, 1], "dspark.drafter": "ngram"}
    events = [
        StreamEvent("r.k", "é \ud800", (7, 8), True, "stop", 5, 9, spec, 2, attrs),
        StreamEvent("r.k", "b", (9,), True, "length", 5, 9, spec, 0, None, (1.5, 1.75, 2.0, 2.5)),
        StreamEvent("r.k", "b", (9,), True, "length", 5, 9, spec, 0, None, (1.5, 1.75, 2.0, 2.5), "abc123"),
        StreamEvent("r.k", "", (), True, "abort", 5, 0, spec, 0, None, (1.5, 1.75, None, None)),
        _event(0, "a"),
        _event(1, "").aborted(),
    ]
    for event in events:
        wire = event.to_wire()
        assert type(wire) is bytes
        back = received(wire)
        assert back == event and type(back.token_ids) is tuple
        assert type(back.speculation.accepted_by_position) is tuple
        assert received(event) is event


def test_the_last_event_says_when_the_engine_took_the_request_and_answered(replica):
    """The engine's part of a request's time to first token travels on its last event only: when it
    reached the replica, was admitted, ran its first prompt chunk and got its first token, in order, on
    this host's monotonic clock (bench/ttft_split.py splits the client's TTFT with it), and which replica
    that was."""
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)

    async def run():
        before = time.monotonic()
        events = [e async for e in decoded(replica.generate(prompt_ids(replica), params, "r1"))]
        return before, events, time.monotonic()

    before, events, after = asyncio.run(run())
    assert [e.timing is None for e in events] == [True] * (len(events) - 1) + [False]
    assert [e.replica for e in events] == [None] * (len(events) - 1) + ["local"]  # no Serve context here
    received, admitted, scheduled, first_token = events[-1].timing
    assert before <= received <= admitted <= scheduled <= first_token <= after


def test_routing_stats_name_the_cached_prompt_pages(replica):
    """What a router reads predicts the prefill a prompt skips here, exactly as the engine then skips it."""
    engine = replica.engine.engine
    system = engine.tokenize(
        "def wrap(text, width=70, **kwargs):\n    return TextWrapper(width=width).wrap(text)\n"
    )
    first, second = system + engine.tokenize("x = 1"), system + engine.tokenize("import os")
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)

    async def run():
        [e async for e in decoded(replica.generate(first, params, "r1"))]
        before = await replica.record_routing_stats()
        events = [e async for e in decoded(replica.generate(second, params, "r2"))]
        return before, await replica.record_routing_stats(), events[-1]

    before, after, last = asyncio.run(run())
    summary = before["prefix_cache"]
    page = engine.pages.page_size
    assert summary["enabled"] and summary["page_size"] == page
    assert summary["cached_pages"] == len(first) // page == len(summary["hashes"])
    predicted = cached_prefix_tokens(second, summary)
    assert predicted == len(system) // page * page > 0
    assert after["prefix_cache"]["cached_prompt_tokens"] - summary["cached_prompt_tokens"] == predicted
    assert after["prefix_cache"]["prompt_tokens"] == len(first) + len(second)
    # The request's own usage says so too, on HTTP (OpenAI's field) and on gRPC (read by the SDK).
    assert last.usage()["prompt_tokens_details"] == {"cached_tokens": predicted}
    builder = CompletionBuilder("r2")
    builder.add(_final("r2", last))
    assert builder.completion.usage == Usage(len(second), 4, len(second) + 4, predicted)


def test_a_stream_interval_gathers_tokens_but_never_past_the_last_step_or_an_abort():
    """With a stream interval of 3 a message waits for 3 tokens (steps arriving one by one), the last
    step ends a shorter message at once, and an abort arriving meanwhile is held behind the tokens."""

    async def one_by_one(pending: asyncio.Queue, items: list) -> None:
        for item in items:  # the next step only once the consumer took the previous one
            while not pending.empty():
                await asyncio.sleep(0)
            pending.put_nowait(item)

    async def run():
        pending: asyncio.Queue = asyncio.Queue()
        loop = asyncio.get_running_loop()
        steps = [
            _event(i, t, finished=f) for i, (t, f) in enumerate([("b", 0), ("c", 0), ("d", 0), ("e", 1)], 1)
        ]
        feeder = loop.create_task(one_by_one(pending, steps))
        three = await coalesce_interval(_event(0, "a"), pending, 3)
        rest = await coalesce_interval(await pending.get(), pending, 3)
        aborting: asyncio.Queue = asyncio.Queue()
        loop.call_soon(aborting.put_nowait, running.ABORTED)
        held = await coalesce_interval(_event(0, "a"), aborting, 3)
        alone = await coalesce_interval(_event(0, "a"), asyncio.Queue(), 1)
        await feeder
        return three, rest, held, alone

    (three, none), (rest, none2), (before_abort, abort), alone = asyncio.run(run())
    assert (three.text, three.token_ids, three.finished, none) == ("abc", (100, 101, 102), False, None)
    assert (rest.text, rest.finished, rest.completion_tokens, none2) == ("de", True, 5, None)
    assert (before_abort.text, abort) == ("a", running.ABORTED)
    assert alone == (_event(0, "a"), None)  # interval 1: nothing waits


def test_a_replica_with_a_stream_interval_sends_fewer_messages_with_the_same_tokens(qwen3_dir):
    from dspark import LLM

    replica = TargetReplica.func_or_class(
        {"model": str(qwen3_dir), "engine": dict(ENGINE), "stream_interval": 4}
    )
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    try:
        events = asyncio.run(_collect(decoded(replica.generate(prompt_ids(replica), params, "si"))))
    finally:
        replica.__del__()
    expected = LLM(str(qwen3_dir), **ENGINE).generate(["def f(x):"], params)[0]
    assert [t for e in events for t in e.token_ids] == expected.token_ids
    assert all(len(e.token_ids) >= 4 for e in events[1:-1]) and events[-1].finished
    assert len(events) <= 1 + -(-15 // 4)  # the first message, then at least 4 tokens per message


async def _collect(stream) -> list[StreamEvent]:
    return [e async for e in stream]
