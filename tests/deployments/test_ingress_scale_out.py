"""Two ingress replicas on the real stack: Abort finds a request whichever ingress admitted it, a
request_id reused across ingresses runs twice without harm, and a huge prompt being tokenized does
not stall the other streams of the ingress's event loop.

Which ingress serves a call is chosen by calling the ingress replica actors directly
(`call_on_replica`); Serve's router would otherwise pick one.
"""

from __future__ import annotations

import asyncio
import time

import pytest
import ray
from ray import serve
from serving import APP, ENGINE, INGRESS_REPLICAS, app_args, call_on_replica, wait_until

from deployments.config import AppConfig
from deployments.frontend import Frontend
from deployments.replicas import replica_actor_names, routing_stats
from deployments.validation import Limits, completion_request
from dspark import LLM, SamplingParams
from dspark.errors import InvalidRequestError
from dspark_client.proto import pb
from dspark_client.types import build_request

LONG = dict(max_tokens=480, temperature=1.0, ignore_eos=True)  # cannot finish within the test's patience


def ingresses() -> list[str]:
    names = replica_actor_names(APP, "Ingress")
    assert len(names) == INGRESS_REPLICAS
    return names


def replicas_idle() -> bool:
    stats = asyncio.run(routing_stats(APP, "TargetReplica"))
    return all(s["running_requests"] == 0 and s["kv_unreserved_pages"] == s["kv_total_pages"] for s in stats)


def test_abort_on_one_ingress_stops_a_stream_opened_on_the_other(serve_stack):
    first_ingress, second_ingress = ingresses()
    request = build_request("def fill(text, width=70):", request_id="cross-ingress-1", **LONG)
    responses = call_on_replica(first_ingress, "Generate", request, None, stream=True)
    first = ray.get(next(responses))
    assert first.request_id == "cross-ingress-1" and first.delta.token_ids

    abort = pb.AbortRequest(request_id="cross-ingress-1")
    assert ray.get(call_on_replica(second_ingress, "Abort", abort, None), timeout=30).aborted is True
    rest = [ray.get(ref) for ref in responses]
    final = rest[-1].final
    assert final.finish_reason == "abort"
    received = len(first.delta.token_ids) + sum(len(r.delta.token_ids) for r in rest[:-1])
    assert final.usage.completion_tokens == received
    # Nothing runs under that id any more, whichever ingress is asked.
    for ingress in (first_ingress, second_ingress):
        assert ray.get(call_on_replica(ingress, "Abort", abort, None), timeout=30).aborted is False
    wait_until(replicas_idle, timeout_s=30, what="the aborted request's KV pages to be freed")


def test_a_request_id_reused_on_two_ingresses_runs_twice_unharmed(serve_stack):
    prompts = ["def wrap(text, width):", "import bisect\n"]
    params = dict(temperature=0.0, max_tokens=24, ignore_eos=True)
    expected = [
        out.token_ids
        for out in LLM(str(serve_stack.model_dir), **ENGINE).generate(prompts, SamplingParams(**params))
    ]
    streams = [
        call_on_replica(
            ingress, "Generate", build_request(p, request_id="reused-1", **params), None, stream=True
        )
        for ingress, p in zip(ingresses(), prompts)
    ]
    # Both are admitted before either is read to its end: they run at the same time.
    firsts = [ray.get(next(s)) for s in streams]
    for first, stream, want in zip(firsts, streams, expected):
        responses = [first, *(ray.get(ref) for ref in stream)]
        assert all(r.request_id == "reused-1" for r in responses)
        assert [t for r in responses[:-1] for t in r.delta.token_ids] == want
        assert responses[-1].final.finish_reason == "length"


@pytest.mark.slow
def test_tokenizing_a_huge_prompt_does_not_stall_other_streams(serve_stack):
    """A real Frontend in this process, with a handle to the stack's target replicas: while a 1 MB
    prompt is tokenized, a running stream's events keep arriving on the same event loop."""
    config = AppConfig(**app_args(serve_stack.model_dir, max_request_bytes=2 << 20))
    frontend = Frontend(serve.get_deployment_handle("TargetReplica", APP), config)
    limits = Limits(max_request_bytes=config.max_request_bytes)
    running = completion_request({"prompt": "def fill(text, width=70):", **LONG}, limits)
    huge_text = ("def f(x):\n    return x * 2  # doubled\n" * 40_000)[: 1 << 20]
    huge = completion_request({"prompt": huge_text, "max_tokens": 4}, limits)

    async def run():
        stream = await frontend.open(running)
        arrivals: list[float] = []

        async def consume():
            async for _ in stream.events():
                arrivals.append(time.monotonic())

        consumer = asyncio.create_task(consume())
        deadline = time.monotonic() + 30
        while len(arrivals) < 3:  # the stream is flowing before the huge request starts
            assert time.monotonic() < deadline, "the stream produced no events"
            await asyncio.sleep(0.01)
        start = time.monotonic()
        with pytest.raises(InvalidRequestError) as err:
            await frontend.open(huge)
        end = time.monotonic()
        # The stream may end inside the window (the tiny target streams its 480 tokens in about a
        # second, and tokenizing 1 MB on a loaded machine can take longer): then it must have ended
        # normally, and the window is checked up to its last event.
        flowing = not consumer.done()
        completed = consumer.done() and consumer.exception() is None
        consumer.cancel()
        await asyncio.gather(consumer, return_exceptions=True)
        return err.value.field, start, end, arrivals, flowing or completed

    field, start, end, arrivals, streamed = asyncio.run(run())
    wait_until(replicas_idle, timeout_s=30, what="the abandoned stream to be aborted")
    assert field == "prompt" and streamed
    window = end - start
    assert window > 0.3, f"tokenizing took {window:.3f}s: too short to tell a stall from a stream"
    # Tokenized on the event loop, no event would be seen inside the window: each arrival would be
    # stamped once the loop was free again, at its end (one gap = the window).
    during = [t for t in arrivals if start <= t < end]
    covered = during[-1] if during and arrivals[-1] < end else end  # its last event when it ended inside
    gaps = [b - a for a, b in zip([start, *during], [*during, covered])]
    assert len(during) >= 3 and max(gaps) < window / 2, (window, gaps)
