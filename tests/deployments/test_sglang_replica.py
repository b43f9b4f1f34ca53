"""The SGLang replica against a STAND-IN for SGLang's engine (sglang_stand_in.StandInEngine: SGLang's GPU
engine cannot run here; the stand-in implements the async_generate / tokenizer-manager contract of SGLang
0.5.23 and uses SGLang's real ServerArgs, LoadSnapshot and SetInternalStateReq types).

In-process: streaming, abort by unique rid, the budget actuator (applied in compact mode, refused in static
mode without asking SGLang), health, telemetry with the real OpenTelemetry SDK. Through Ray Serve: the app
built by build_app with backend sglang, HTTP streaming, routing stats, a client disconnect aborting inside
the engine, and the static-mode refusal over a deployment handle."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
from sglang_cpu import require_sglang

require_sglang()

import http.client  # noqa: E402
import json  # noqa: E402
from urllib.parse import urlparse  # noqa: E402

import openai  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from ray import serve  # noqa: E402
from serving import wait_until  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from controller.telemetry import from_routing_stats  # noqa: E402
from deployments import sglang_replica  # noqa: E402
from deployments.app import build_app  # noqa: E402
from deployments.sglang_artifacts import write_sps_table  # noqa: E402
from deployments.sglang_replica import SGLangReplica  # noqa: E402
from dspark.cost_table import CostTable  # noqa: E402
from dspark.errors import InvalidRequestError  # noqa: E402
from dspark.sampling_params import SamplingParams  # noqa: E402
from tests.deployments.sglang_stand_in import ACCEPT_PATTERN, expected_tokens  # noqa: E402
from tests.drafter_service.drafter_fixtures import save_untrained_dspark  # noqa: E402

STAND_IN = "tests.deployments.sglang_stand_in:StandInEngine"
GAMMA = 4


def app_config(model_dir, mode: str = "compact", sps_table: str | None = None, **fields) -> dict:
    sglang = {"verify_mode": mode, "engine_class": STAND_IN, "num_gpus": 0}
    return {
        "model": str(model_dir),
        "backend": "sglang",
        "engine": {
            "drafter": "dspark",
            "drafter_model": str(model_dir),
            "num_speculative_tokens": GAMMA,
            "max_num_seqs": 8,
        },  # fmt: skip
        "sglang": sglang | ({"sps_table": sps_table} if sps_table else {}),
        **fields,
    }


@pytest.fixture(scope="module")
def sps_table(tmp_path_factory) -> str:
    """A profiled SPS table in SGLang's format: with it, SGLang's compact mode schedules a budget."""
    table = CostTable([1, 8, 32], [500.0, 450.0, 300.0], max_tokens=64)
    return str(write_sps_table(table, tmp_path_factory.mktemp("sps") / "sps.json"))


@pytest.fixture
def make_replica(qwen3_dir, sps_table):
    made = []

    def make(mode: str = "compact", profiled: bool = True, **fields) -> SGLangReplica:
        config = app_config(qwen3_dir, mode, sps_table if profiled else None, **fields)
        made.append(SGLangReplica.func_or_class(config))
        return made[-1]

    yield make
    for replica in made:
        replica.__del__()
        assert replica.engine.shut_down


async def until(predicate, timeout_s: float = 30.0) -> None:
    """Poll `predicate` on the running event loop; fail after `timeout_s`."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "timed out waiting on the stand-in engine"
        await asyncio.sleep(0.01)


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)


def test_streams_our_events_from_sglangs_cumulative_chunks(make_replica):
    replica = make_replica()
    prompt = [5, 9, 11]

    async def run():
        return [e async for e in replica.generate(prompt, greedy(12), "client-1")], await replica.model_info()

    events, info = asyncio.run(run())
    tokens = [t for e in events for t in e.token_ids]
    assert tokens == expected_tokens(prompt, 12, info["vocab_size"])
    assert "".join(e.text for e in events) == replica.engine.tokenizer.decode(tokens)
    assert len(events) > 1 and all(len(e.token_ids) >= 1 for e in events)  # rounds commit several tokens
    assert [e.finished for e in events] == [False] * (len(events) - 1) + [True]
    last = events[-1]
    assert (last.request_id, last.finish_reason, last.prompt_tokens, last.completion_tokens) == (
        "client-1", "length", 3, 12)  # fmt: skip
    rounds = last.speculation.rounds
    accepted = [min(GAMMA, ACCEPT_PATTERN[i % len(ACCEPT_PATTERN)]) for i in range(rounds)]
    assert last.speculation.accepted_tokens == sum(accepted) and rounds > 0
    assert last.speculation.drafted_tokens == rounds * GAMMA  # compact window with no budget set: all
    (sent,) = replica.engine.seen.requests
    assert re.fullmatch(r"[0-9a-f]{32}", sent["rid"]) and sent["input_ids"] == prompt
    assert sent["sampling_params"]["max_new_tokens"] == 12 and sent["sampling_params"]["temperature"] == 0.0
    assert info == {"max_model_len": 512, "vocab_size": len(replica.engine.tokenizer), "drafter": "dspark",
                    "num_speculative_tokens": GAMMA, "tensor_parallel_size": 1,
                    "backend": "sglang"}  # fmt: skip


def test_cancelling_a_stream_aborts_only_its_own_rid(make_replica):
    """Client ids 'r1' and 'r10' would prefix-match in SGLang's scheduler; the replica's rids never do."""
    replica = make_replica()

    async def run():
        async def consume(request_id: str):
            return [e async for e in replica.generate([1, 2], greedy(40), request_id)]

        short, other = asyncio.create_task(consume("r1")), asyncio.create_task(consume("r10"))
        await until(lambda: len(replica.engine.running) == 2)
        short.cancel()
        events = await other
        stats = await replica.record_routing_stats()
        return events, stats

    events, stats = asyncio.run(run())
    rid_r1 = replica.engine.seen.requests[0]["rid"]
    assert replica.engine.seen.aborts[0] == rid_r1 and set(replica.engine.seen.aborts) == {rid_r1}
    assert sum(len(e.token_ids) for e in events) == 40 and events[-1].finish_reason == "length"
    assert (stats["running_requests"], stats["aborted_requests"], stats["finished_requests"]) == (0, 1, 1)
    assert stats["recent_tau"] == events[-1].speculation.mean_accept_length and stats["healthy"]


def test_abort_by_client_id_ends_every_stream_under_it_and_nothing_else(make_replica):
    replica = make_replica()

    async def run():
        async def consume(request_id: str):
            return [e async for e in replica.generate([1, 2], greedy(60), request_id)]

        tasks = [asyncio.create_task(consume(i)) for i in ("a", "a", "b")]
        await until(lambda: len(replica.engine.running) == 3)
        aborted = await replica.abort("a")
        return aborted, await asyncio.gather(*tasks), await replica.abort("nobody")

    aborted, (a1, a2, b), none = asyncio.run(run())
    assert (aborted, none) == (2, 0)
    assert a1[-1].finish_reason == a2[-1].finish_reason == "abort" and b[-1].finish_reason == "length"
    assert sum(len(e.token_ids) for e in b) == 60 and sum(len(e.token_ids) for e in a1) < 60
    rids = {r["rid"] for r in replica.engine.seen.requests[:2]}
    assert set(replica.engine.seen.aborts) == rids == set(replica.engine.seen.aborted)


def test_budget_moves_in_compact_mode_and_reads_back(make_replica):
    replica = make_replica()

    async def run():
        applied = await replica.set_draft_budget({"max_request_tokens": 2})
        events = [e async for e in replica.generate([3], greedy(20), "b")]
        stats = await replica.record_routing_stats()
        with pytest.raises(InvalidRequestError) as step:
            await replica.set_draft_budget({"max_request_tokens_by_class": {"batch": 1}})
        cleared = await replica.set_draft_budget({})
        return applied, events[-1], stats, step.value, cleared

    applied, last, stats, step, cleared = asyncio.run(run())
    frac = (2 + 1e-6) / GAMMA
    assert replica.engine.seen.internal_state_requests == [
        {"dspark_force_budget_frac": frac}, {"dspark_force_budget_frac": None}]  # fmt: skip
    assert applied["max_request_tokens"] == 2 and applied["sglang"]["dspark_force_budget_frac"] == frac
    assert stats["draft_budget"] == applied
    assert last.speculation.drafted_tokens == last.speculation.rounds * 2  # the stand-in obeyed frac
    assert step.field == "max_request_tokens_by_class"
    assert cleared["sglang"]["dspark_force_budget_frac"] is None and cleared["max_request_tokens"] is None


@pytest.mark.parametrize(
    ("mode", "profiled", "why", "meaning"),
    [
        ("static", True, "static", "every drafted token is verified"),
        ("compact", False, "without a profiled SPS table",
         "every drafted token is verified (compact mode without a profiled SPS table)"),
    ],
)  # fmt: skip
def test_a_budget_sglang_would_ignore_is_refused_without_asking_it(
    make_replica, mode, profiled, why, meaning
):
    """SGLang itself would answer True (a no-op in static mode, and in compact mode with no profiled SPS
    table, where its planner verifies all): the replica must not pass that on as applied."""
    replica = make_replica(mode, profiled)

    async def run():
        with pytest.raises(InvalidRequestError) as refused:
            await replica.set_draft_budget({"max_request_tokens": 2})
        events = [e async for e in replica.generate([3], greedy(10), "c")]
        return refused.value, await replica.set_draft_budget({}), events[-1]

    refused, unlimited, last = asyncio.run(run())
    assert refused.field == "max_request_tokens" and why in refused.message
    assert replica.engine.seen.internal_state_requests == []
    assert unlimited["sglang"] == {"verify_mode": mode, "dspark_force_budget_frac": None, "meaning": meaning}
    assert last.speculation.drafted_tokens == last.speculation.rounds * GAMMA  # SGLang verified all


def test_controller_reads_spec_windows_and_caps_apply_or_are_refused_by_field(make_replica):
    """The controller's surface on the SGLang replica: its window of spec stats (rounds, acceptance,
    verified drafts per round) read the way the controller reads TargetReplica, caps SGLang can apply set
    through its one knob, the rest refused naming the field, and recalibration pushes refused saying why."""
    replica = make_replica()
    chat = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, sla_class="chat")

    async def run():
        first = await replica.controller_snapshot()  # nothing served yet: an empty window
        consumer = asyncio.create_task(_drain(replica.generate([4, 2], chat, "c1")))
        await until(lambda: len(replica.engine.running) == 1)
        during = await replica.controller_snapshot()
        last = (await consumer)[-1]
        after = await replica.controller_snapshot()
        again = await replica.controller_snapshot()
        applied = await replica.apply_caps({"local": {"max_request_tokens": 2}, "other": {}})
        refused = await replica.apply_caps(
            {"local": {"max_request_tokens": 2, "max_request_tokens_by_class": {"batch": 1}}}
        )
        ignored = await replica.apply_caps({"other": {"max_request_tokens": 1}})
        sts = await replica.set_sts_temperatures({0.0: [1.5] * GAMMA})
        table = await replica.rescale_cost_table({"local": 1.3})
        return first, during, last, after, again, applied, refused, ignored, sts, table

    first, during, last, after, again, applied, refused, ignored, sts, table = asyncio.run(run())
    assert first["window_rounds"] == 0 and first["replica_id"] == "local"
    assert (first["draft_window"], first["adaptive_verify"], first["sts_temperatures"]) == (GAMMA, True, {})
    assert during["running_by_class"] == {"chat": 1}
    spec = last.speculation
    assert after["window_rounds"] == spec.rounds and after["running_by_class"] == {}
    assert after["recent_tau"] == pytest.approx(spec.mean_accept_length)
    assert after["mean_verified"] == spec.drafted_tokens / spec.rounds == GAMMA
    assert again["window_rounds"] == 0  # each reading starts a fresh window

    # The controller's reading of it (controller/telemetry.py), as for a built-in replica.
    view = from_routing_stats(after, taken_at=0.0)
    assert view.window == GAMMA and view.verified_drafts == spec.drafted_tokens
    assert view.classes == {} and len(view.acceptance) == GAMMA

    assert applied["draft_budget"]["max_request_tokens"] == 2
    assert applied["refusals"] == []
    assert (
        replica.engine.seen.internal_state_requests == [{"dspark_force_budget_frac": (2 + 1e-6) / GAMMA}] * 2
    )
    (why,) = refused["refusals"]  # the class cap refused by reason, the request cap still applied
    assert (why["field"], why["reason"]) == ("max_request_tokens_by_class", "sglang_no_class_budget")
    assert refused["draft_budget"] == applied["draft_budget"]
    assert ignored is None
    assert sts["refused"]["field"] == "sts_temperatures" and "no runtime setter" in sts["refused"]["message"]
    assert sts["refused"]["reason"] == "sglang_no_runtime_sts"
    assert table["refused"]["field"] == "sps_table" and "at start only" in table["refused"]["message"]
    assert table["refused"]["reason"] == "sglang_sps_table_at_start_only"
    assert len(replica.engine.seen.internal_state_requests) == 2  # refusals never reached SGLang


def test_a_step_cap_becomes_sglangs_budget_per_running_request(make_replica):
    """SGLang has no fixed per-step cap; the controller's step cap K arrives as K tokens at the n requests
    running then (frac = K / (n x gamma)), which SGLang's override scales with the batch. What it cannot
    apply is refused field by field with a reason code, and the rest still applies."""
    replica = make_replica()
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)

    async def run():
        idle = await replica.apply_caps({"local": {"max_step_tokens": 3}})  # nobody runs: binds nothing
        streams = [asyncio.create_task(_drain(replica.generate([4, 2], params, f"s{i}"))) for i in range(2)]
        await until(lambda: len(replica.engine.running) == 2)
        capped = await replica.apply_caps(
            {"local": {"max_step_tokens": 3, "max_request_tokens_by_class": {"b": 1}}}
        )
        off = await replica.apply_caps({"local": {"max_step_tokens": 0}})
        ends = [(await s)[-1] for s in streams]
        return idle, capped, off, ends

    idle, capped, off, ends = asyncio.run(run())
    assert (
        idle["refusals"] == [] and idle["draft_budget"]["max_step_tokens"] is None
    )  # cleared: re-sent later
    frac = (3 + 1e-6) / (2 * GAMMA)
    assert capped["draft_budget"]["max_step_tokens"] == 3
    assert capped["draft_budget"]["sglang"]["dspark_force_budget_frac"] == frac
    assert "3 at the 2 running" in capped["draft_budget"]["sglang"]["meaning"]
    assert [(r["field"], r["reason"]) for r in capped["refusals"]] == [
        ("max_request_tokens_by_class", "sglang_no_class_budget")
    ]
    assert [(r["field"], r["reason"]) for r in off["refusals"]] == [
        ("max_step_tokens", "sglang_no_runtime_plain_decoding")
    ]
    assert off["draft_budget"]["sglang"]["dspark_force_budget_frac"] is None  # the rest: no limit
    assert replica.engine.seen.internal_state_requests == [
        {"dspark_force_budget_frac": None},
        {"dspark_force_budget_frac": frac},
        {"dspark_force_budget_frac": None},
    ]
    assert all(e.finish_reason == "length" for e in ends)


def test_in_static_mode_every_cap_is_refused_as_ignored(make_replica):
    replica = make_replica("static", True)
    result = asyncio.run(replica.apply_caps({"local": {"max_step_tokens": 5, "max_request_tokens": 2}}))
    assert [(r["field"], r["reason"]) for r in result["refusals"]] == [
        ("max_step_tokens", "sglang_knob_ignored"),
        ("max_request_tokens", "sglang_knob_ignored"),
    ]
    assert replica.engine.seen.internal_state_requests == []  # SGLang never asked


async def _drain(stream) -> list:
    return [e async for e in stream]


def test_health_fails_while_sglang_produces_nothing_and_when_it_exits(make_replica):
    replica = make_replica(stuck_after_s=0.2)

    def problem():
        try:
            replica.check_health()
        except RuntimeError as exc:
            return str(exc)

    async def run():
        replica.engine.step_s = 30.0  # the stand-in's next verify round takes 30 s: a stalled GPU
        task = asyncio.create_task(anext(replica.generate([4], greedy(4), "slow")))
        await until(problem)
        found = problem()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return found

    assert "no output from SGLang" in asyncio.run(run())
    assert problem() is None  # nothing in flight any more
    replica.tokenizer_manager.gracefully_exit = True
    assert "shutting down" in problem()


def test_request_span_is_the_parent_of_sglangs_trace(make_replica, monkeypatch):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(sglang_replica, "tracer", provider.get_tracer("test"))
    replica = make_replica(served_model_name="m")

    # The ingress's span, as its W3C context arrives at the replica (trace_context).
    caller_trace, caller_span = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    caller = {"traceparent": f"00-{caller_trace}-{caller_span}-01"}

    async def run():
        alone = [e async for e in replica.generate([7, 7], greedy(6), "traced")]
        [e async for e in replica.generate([7], greedy(2), "chat-1", trace_context=caller, operation="chat")]
        return alone

    last = asyncio.run(run())[-1]
    span, child = exporter.get_finished_spans()
    assert (span.name, span.parent) == ("text_completion m", None)
    attrs = dict(span.attributes)
    assert attrs["gen_ai.request.model"] == "m" and attrs["gen_ai.usage.output_tokens"] == 6
    assert attrs["dspark.rounds"] == last.speculation.rounds > 0 and attrs["dspark.request_id"] == "traced"
    assert (child.name, child.attributes["gen_ai.operation.name"]) == ("chat m", "chat")
    assert (f"{child.context.trace_id:032x}", f"{child.parent.span_id:016x}") == (caller_trace, caller_span)
    for sent, ours in zip(replica.engine.seen.requests, (span, child)):  # SGLang's spans join ours
        assert sent["external_trace_header"]["traceparent"].split("-")[1:3] == [
            f"{ours.context.trace_id:032x}",
            f"{ours.context.span_id:016x}",
        ]


@pytest.fixture(scope="module")
def sglang_app(serve_stack, tmp_path_factory):
    """The stand-in SGLang app beside the shared stack, built by build_app like any config. The drafter
    is a real DSpark checkpoint: build_app runs SGLang's own checks of it before anything starts."""
    config = app_config(serve_stack.model_dir, "static", served_model_name=serve_stack.model_name,
                        num_replicas=1, num_ingress_replicas=1, replica_num_cpus=0.25, ingress_num_cpus=0.25,
                        health_check_period_s=1.0, graceful_shutdown_timeout_s=2.0)  # fmt: skip
    drafter = tmp_path_factory.mktemp("sglang_drafter") / "dspark"
    save_untrained_dspark(Path(serve_stack.model_dir), drafter, GAMMA)
    config["engine"]["drafter_model"] = str(drafter)
    serve.run(build_app(config), name="sglang", route_prefix="/sglang")
    yield serve_stack
    serve.delete("sglang")


def test_served_through_ray_serve(sglang_app):
    client = openai.OpenAI(
        base_url=sglang_app.http_url + "/sglang/v1", api_key="x", max_retries=0, timeout=60
    )
    tokenizer = AutoTokenizer.from_pretrained(sglang_app.model_dir)
    prompt = "def wrap(text, width):"
    chunks = list(client.completions.create(model=sglang_app.model_name, prompt=prompt, max_tokens=10,
                                            temperature=0, stream=True))  # fmt: skip
    expected = expected_tokens(tokenizer.encode(prompt, add_special_tokens=False), 10, len(tokenizer))
    assert "".join(c.choices[0].text for c in chunks) == tokenizer.decode(expected)
    speculation = chunks[-1].model_extra["dspark"]["speculation"]
    assert speculation["rounds"] > 0 and speculation["drafted_tokens"] == speculation["rounds"] * GAMMA

    handle = serve.get_deployment_handle("TargetReplica", app_name="sglang")
    with pytest.raises(Exception, match="max_request_tokens.*static"):
        handle.set_draft_budget.remote({"max_request_tokens": 1}).result()

    # A client that leaves mid-stream: the replica aborts inside the engine; the next stats show it.
    url = urlparse(sglang_app.http_url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
    body = json.dumps({"prompt": prompt, "max_tokens": 400, "stream": True})
    conn.request("POST", "/sglang/v1/completions", body, {"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.readline().startswith(b"data: ")  # the stream is running
    conn.sock.close()  # hang up without reading on
    conn.close()
    # The replica counts the abort when the stream is cancelled and asks the engine to abort
    # (fire-and-forget, as SGLang's abort_request is): the engine's running count drops when its
    # scheduler has processed it, so both are awaited.
    stats = wait_until(
        lambda: (
            (s := handle.record_routing_stats.remote().result())["aborted_requests"] == 1
            and s["running_requests"] == 0
            and s
        ),
        timeout_s=60,
        what="the abort to reach the replica and its engine",
    )
    assert (stats["running_requests"], stats["finished_requests"], stats["backend"]) == (0, 1, "sglang")
    assert stats["recent_tau"] > 1 and stats["healthy"]


class _Broadcast:
    """The controller's broadcast handle over one in-process replica (no Serve: the class directly)."""

    def __init__(self, replica) -> None:
        self.replica = replica

    def broadcast(self, method: str, *args):
        replica = self.replica

        class _Pending:
            async def results_async(self, timeout_s: float, return_exceptions: bool):
                return [await getattr(replica, method)(*args)]

        return _Pending()


def test_the_controllers_decision_names_what_the_sglang_replica_refused(make_replica, qwen3_dir, sps_table):
    """The real Controller class over the SGLang replica (stand-in engine): a pinned budget with a step cap
    and a class cap; the decision carries the class cap's refusal by reason code, the state lists it."""
    from controller.decision import Caps
    from deployments.controller import Controller

    replica = make_replica()
    config = app_config(qwen3_dir, "compact", sps_table, controller={"period_s": 1, "admin_tokens": ["t"]})

    async def run():
        cls = Controller.func_or_class
        controller = cls.__new__(cls)
        await cls.__init__(controller, _Broadcast(replica), config)  # Serve awaits an async __init__
        controller._task.cancel()  # periods by hand
        controller.policy.pins["local"] = Caps(max_step_tokens=3, by_class={"b": 1})
        (decision,) = await controller.tick()
        return controller, decision

    controller, decision = asyncio.run(run())
    assert decision.reason.value == "pinned"
    assert decision.inputs["refused"] == {"max_request_tokens_by_class": "sglang_no_class_budget"}
    (listed,) = controller.refusals.values()
    assert listed["reasons"] == {"max_request_tokens_by_class": "sglang_no_class_budget"}
    assert replica.engine.seen.internal_state_requests == [{"dspark_force_budget_frac": None}]  # nobody runs
