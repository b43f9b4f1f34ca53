"""dspark_client against the real Ray Serve stack: stream, generate, abort, deadlines, typed errors."""

from __future__ import annotations

import asyncio

import pytest
from serving import APP, ENGINE, wait_until

import dspark_client
from deployments.replicas import routing_stats
from dspark import LLM, SamplingParams

PROMPT = "def fill(text, width=70):"
LONG = dict(max_tokens=480, temperature=1.0, ignore_eos=True)  # cannot finish within the test's patience


@pytest.fixture(scope="module")
def client(serve_stack):
    with dspark_client.Client(serve_stack.grpc_target, timeout_s=60) as client:
        yield client


def replicas_idle() -> bool:
    stats = asyncio.run(routing_stats(APP, "TargetReplica"))
    return all(s["running_requests"] == 0 and s["kv_unreserved_pages"] == s["kv_total_pages"] for s in stats)


def test_generate_equals_offline_greedy(client, serve_stack):
    expected = LLM(str(serve_stack.model_dir), **ENGINE).generate(
        [PROMPT], SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    )[0]
    out = client.generate(PROMPT, temperature=0.0, max_tokens=24, ignore_eos=True)
    assert out.text == expected.text and list(out.token_ids) == expected.token_ids
    assert out.finish_reason == "length" and out.usage.completion_tokens == 24
    assert out.usage.prompt_tokens == len(expected.prompt_token_ids)
    assert out.speculation.rounds >= 1 and out.speculation.mean_accept_length >= 1.0


def test_stream_yields_deltas_then_completion(client):
    with client.stream(PROMPT, temperature=0.0, max_tokens=16) as stream:
        deltas = list(stream)
    assert stream.completion is not None and stream.completion.finish_reason in ("length", "stop")
    assert "".join(d.text for d in deltas) == stream.completion.text
    assert sum(len(d.token_ids) for d in deltas) == stream.completion.usage.completion_tokens


def test_abort_ends_the_stream_and_frees_the_request(client):
    stream = client.stream(PROMPT, **LONG)
    first = next(stream)
    assert first.token_ids
    assert client.abort(stream.request_id) is True
    rest = list(stream)
    assert stream.completion.finish_reason == "abort"
    assert stream.completion.usage.completion_tokens == len(first.token_ids) + sum(
        len(d.token_ids) for d in rest
    )
    assert client.abort(stream.request_id) is False  # idempotent: nothing left to abort
    wait_until(replicas_idle, timeout_s=30, what="the aborted request's KV blocks to be freed")


def test_deadline_exceeded_is_typed_and_frees_the_request(client):
    with pytest.raises(dspark_client.DeadlineExceededError):
        client.generate(PROMPT, timeout=0.5, **LONG)
    wait_until(replicas_idle, timeout_s=30, what="the timed-out request to be aborted")


def test_invalid_argument_is_typed_with_the_field(client):
    with pytest.raises(dspark_client.InvalidArgumentError) as err:
        client.generate(PROMPT, max_tokens=0)
    assert err.value.field == "max_tokens"


def test_a_reused_request_id_runs_apart_and_abort_stops_both(client):
    # A request_id labels requests rather than keying them: reusing one is harmless, and Abort
    # reaches every request under it, whichever ingress and replica each landed on.
    one = client.stream(PROMPT, request_id="dup-1", **LONG)
    two = client.stream("import os\n", request_id="dup-1", **LONG)
    firsts = [next(one), next(two)]
    assert client.abort("dup-1") is True
    for stream, first in zip((one, two), firsts):
        rest = list(stream)
        assert stream.completion.finish_reason == "abort"
        received = len(first.token_ids) + sum(len(d.token_ids) for d in rest)
        assert stream.completion.usage.completion_tokens == received
    assert client.abort("dup-1") is False
    wait_until(replicas_idle, timeout_s=30, what="both aborted requests to be freed")


def test_model_info_loads_health(client, serve_stack):
    info = client.model_info()
    assert info.model == serve_stack.model_name and info.num_replicas == 2
    loads = client.loads()
    assert len(loads) == 2 and all(r.healthy for r in loads)
    assert client.health() == "SERVING"


def test_async_client(serve_stack):
    async def run():
        async with dspark_client.AsyncClient(serve_stack.grpc_target, timeout_s=60) as client:
            deltas, stream = [], client.stream(PROMPT, temperature=0.0, max_tokens=12)
            async for delta in stream:
                deltas.append(delta)
            whole = await client.generate(PROMPT, temperature=0.0, max_tokens=12)
            with pytest.raises(dspark_client.InvalidArgumentError) as err:
                await client.generate("", max_tokens=4)
            return deltas, stream.completion, whole, err.value.field, await client.health()

    deltas, completion, whole, field, health = asyncio.run(run())
    assert "".join(d.text for d in deltas) == completion.text == whole.text
    assert field == "prompt" and health == "SERVING"
