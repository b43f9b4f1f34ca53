"""The ingress core without Ray: auth, model and context checks, reused ids, Abort's fan-out."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from deployments.config import AppConfig
from deployments.errors import UnauthorizedError
from deployments.events import StreamEvent
from deployments.frontend import INLINE_PROMPT_CHARS, Frontend
from deployments.validation import Limits, chat_request, completion_request
from dspark.errors import InvalidRequestError
from dspark.outputs import SpeculationStats
from dspark.telemetry.semconv import TEXT_COMPLETION
from dspark.telemetry.spans import RequestSpan
from router import decisions
from router.policy import Candidate, Decision, Prediction, ReplicaState


class FakeSource:
    """A DeploymentResponseGenerator stand-in: a few events, or a cancellation error once cancelled."""

    def __init__(self, n: int) -> None:
        self.events = [
            StreamEvent(
                "r",
                f"t{i}",
                (i,),
                i == n - 1,
                "length" if i == n - 1 else None,
                3,
                i + 1,
                SpeculationStats(i, 0, 0, 1.0),
            )
            for i in range(n)
        ]
        self.cancelled = False

    async def __anext__(self):
        if self.cancelled:
            raise RuntimeError("request cancelled")
        if not self.events:
            raise StopAsyncIteration
        return self.events.pop(0)

    def cancel(self):
        self.cancelled = True


class FakeBroadcast:
    def __init__(self, results: list) -> None:
        self.results = results

    async def results_async(self, timeout_s=None, return_exceptions=False):
        return self.results


class FakeReplica:
    def __init__(self, n: int = 3, abort_results: list | None = None) -> None:
        self.n, self.sources, self.broadcasts, self.calls = n, [], [], []
        self.abort_results = abort_results or [0, 0]

    def broadcast(self, method: str, *args):
        self.broadcasts.append((method, *args))
        return FakeBroadcast(self.abort_results)

    def options(self, **_):
        return self

    @property
    def model_info(self):
        return self

    @property
    def generate(self):
        return self

    def remote(self, *args, **kwargs):
        if not args:  # model_info.remote()

            async def info():
                return {
                    "max_model_len": 64,
                    "vocab_size": 384,
                    "drafter": "ngram",
                    "num_speculative_tokens": 4,
                    "tensor_parallel_size": 1,
                }

            return info()
        self.calls.append((args, kwargs))
        self.sources.append(FakeSource(self.n))
        return self.sources[-1]


def frontend(qwen3_dir, n: int = 3, **config) -> Frontend:
    # The fake speaks the per-request protocol; the multiplexed one runs in test_stream_mux_serving.
    return Frontend(FakeReplica(n), AppConfig(model=str(qwen3_dir), stream_mux=False, **config))


def request(**body):
    return completion_request({"prompt": "def f(x):", **body}, Limits())


def test_bearer_tokens(qwen3_dir):
    frontend(qwen3_dir).authorize(None)  # open when no keys are configured
    guarded = frontend(qwen3_dir, api_keys=["k1"])
    guarded.authorize("Bearer k1")
    for bad in (None, "Bearer k2", "k3"):
        with pytest.raises(UnauthorizedError):
            guarded.authorize(bad)


def test_bearer_tokens_from_a_file(qwen3_dir, tmp_path):
    """What the chart mounts from a Secret: one token per line, besides any inline `api_keys`."""
    keys = tmp_path / "api-keys"
    keys.write_text("k-file-1\n\n  k-file-2  \n")
    guarded = frontend(qwen3_dir, api_keys=["k-inline"], api_keys_file=str(keys))
    for good in ("Bearer k-inline", "Bearer k-file-1", "Bearer k-file-2"):
        guarded.authorize(good)
    with pytest.raises(UnauthorizedError):
        guarded.authorize("Bearer k-file-3")
    keys.write_text("\n")  # an empty Secret fails the start instead of opening the service
    with pytest.raises(ValueError, match="api_keys_file"):
        frontend(qwen3_dir, api_keys_file=str(keys))


def test_model_and_context_checks(qwen3_dir):
    fe = frontend(qwen3_dir)
    for body, field in [
        ({"model": "other"}, "model"),
        ({"max_tokens": 63}, "max_tokens"),
        ({"prompt": "x " * 80}, "prompt"),
    ]:
        with pytest.raises(InvalidRequestError) as err:
            asyncio.run(fe.open(request(**body)))
        assert err.value.field == field


def test_a_chat_template_refusal_is_a_bad_request(qwen3_dir):
    fe = frontend(qwen3_dir)
    fe.tokenizer.chat_template = "{{ raise_exception('Conversation roles must alternate') }}"
    req = chat_request({"messages": [{"role": "assistant", "content": "hi"}]}, Limits())
    with pytest.raises(InvalidRequestError) as err:
        asyncio.run(fe.open(req))
    assert err.value.field == "messages" and "roles must alternate" in err.value.message


def test_a_reused_request_id_opens_a_second_stream(qwen3_dir):
    fe = frontend(qwen3_dir, n=2)

    async def run():
        one = await fe.open(request(request_id="r"))
        two = await fe.open(request(request_id="r", prompt="import os"))
        return [e async for e in one.events()], [e async for e in two.events()], one, two

    first, second, one, two = asyncio.run(run())
    assert one.request_id == two.request_id == "r" and len(fe.replica.sources) == 2
    assert [e.text for e in first] == [e.text for e in second] == ["t0", "t1"]


@pytest.mark.parametrize(
    "results, aborted",
    [([0, 1], True), ([2, 0], True), ([0, 0], False), ([RuntimeError("replica died"), 0], False)],
)
def test_abort_asks_every_target_replica(qwen3_dir, results, aborted):
    fe = Frontend(FakeReplica(abort_results=results), AppConfig(model=str(qwen3_dir), stream_mux=False))
    assert asyncio.run(fe.abort("r")) is aborted
    assert fe.replica.broadcasts == [("abort", "r")]


def test_finished_stream_leaves_nothing_behind(qwen3_dir):
    fe = frontend(qwen3_dir, n=3)

    async def run():
        stream = await fe.open(request())
        return [e async for e in stream.events()]

    events = asyncio.run(run())
    assert [e.text for e in events] == ["t0", "t1", "t2"] and events[-1].finished
    assert not fe.replica.sources[0].cancelled


def test_a_stream_left_early_cancels_its_source(qwen3_dir):
    fe = frontend(qwen3_dir, n=5)

    async def run():
        stream = await fe.open(request())
        events = stream.events()
        await events.__anext__()
        await events.aclose()  # the client went away after the first event

    asyncio.run(run())
    assert fe.replica.sources[0].cancelled


class RoutingReplica(FakeReplica):
    """FakeReplica plus what the SLA router does in the ingress process when Serve routes a call: it
    records its decision under the call's route key (router/serve_router.py) and the replica it chose."""

    def __init__(self, decision: Decision) -> None:
        super().__init__()
        self.decision = decision

    def remote(self, *args, **kwargs):
        if args:
            decisions.record(kwargs["route"].key, self.decision, placed_on="r2")
        return super().remote(*args, **kwargs)


def test_route_decision_is_an_event_of_the_request_span(qwen3_dir):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    best = Prediction(ttft_s=0.05, tpot_s=0.02, tpot_others_s=0.021, slack=0.4)
    other = Prediction(ttft_s=0.2, tpot_s=0.03, tpot_others_s=0.035, slack=0.1)
    decision = Decision(
        action="route",
        ranking=("r2", "r1"),
        reason="most slack",
        candidates=(
            Candidate(ReplicaState("r2", None, running=1), 0, best),
            Candidate(ReplicaState("r1", None, running=3), 0, other),
        ),
        excluded={"r3": "kv"},
    )
    fe = Frontend(RoutingReplica(decision), AppConfig(model=str(qwen3_dir), stream_mux=False))

    async def run() -> list:
        span = RequestSpan(provider.get_tracer("test"), TEXT_COMPLETION, fe.model_name)
        stream = await fe.open(request(), span)
        return [e async for e in stream.events()]

    asyncio.run(run())
    (span,) = exporter.get_finished_spans()
    (event,) = [e for e in span.events if e.name == decisions.EVENT]
    attrs = dict(event.attributes)
    assert attrs["dspark.route.action"] == "route"
    assert attrs["dspark.route.reason"] == "most slack"
    assert list(attrs["dspark.route.ranking"]) == ["r2", "r1"]
    assert attrs["dspark.route.placed_on"] == "r2"
    assert json.loads(attrs["dspark.route.excluded"]) == {"r3": "kv"}
    assert json.loads(attrs["dspark.route.scores"]) == {
        "r2": {
            "tier": "fresh",
            "load": 1,
            "ttft_ms": 50.0,
            "tpot_ms": 20.0,
            "tpot_others_ms": 21.0,
            "slack": 0.4,
        },
        "r1": {
            "tier": "fresh",
            "load": 3,
            "ttft_ms": 200.0,
            "tpot_ms": 30.0,
            "tpot_others_ms": 35.0,
            "slack": 0.1,
        },
    }
    assert "dspark.route.retry_after_s" not in attrs
    assert decisions.pop(fe.replica.calls[0][1]["route"].key) is None  # collected once, not left behind


def test_short_prompts_are_tokenized_on_the_event_loop_long_ones_and_chats_on_the_pool(qwen3_dir):
    """A short prompt costs less to tokenize than the hop to the pool's thread and back (time to first
    token); a long prompt or a chat template never blocks the loop that carries the other streams."""
    fe = frontend(qwen3_dir, n=1)
    fe._info = {"max_model_len": 1 << 20, "vocab_size": len(fe.tokenizer)}  # room for the long prompt
    routed, threads = fe.routed_prompt, []

    def recording(req, info):
        threads.append(threading.get_ident())
        return routed(req, info)

    fe.routed_prompt = recording
    requests = [
        request(prompt="a" * INLINE_PROMPT_CHARS),
        request(prompt="a" * (INLINE_PROMPT_CHARS + 1)),
        request(prompt=[5, 6, 7]),
        chat_request({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}, Limits()),
    ]

    async def run():
        for req in requests:
            await fe.open(req)
        return threading.get_ident()

    loop_thread = asyncio.run(run())
    assert [t == loop_thread for t in threads] == [True, False, True, False]
    assert [call[0][0] for call in fe.replica.calls][2] == [5, 6, 7]
