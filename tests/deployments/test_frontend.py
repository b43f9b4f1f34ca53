"""The ingress core without Ray: auth, model and context checks, duplicate ids, Abort's stream ending."""

from __future__ import annotations

import asyncio

import pytest

from deployments.config import AppConfig
from deployments.errors import DuplicateRequestError, UnauthorizedError
from deployments.events import StreamEvent
from deployments.frontend import Frontend
from deployments.validation import Limits, chat_request, completion_request
from dspark.errors import InvalidRequestError
from dspark.outputs import SpeculationStats


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


class FakeReplica:
    def __init__(self, n: int = 3) -> None:
        self.n, self.sources = n, []

    def options(self, **_):
        return self

    @property
    def model_info(self):
        return self

    @property
    def generate(self):
        return self

    def remote(self, *args):
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
        self.sources.append(FakeSource(self.n))
        return self.sources[-1]


def frontend(qwen3_dir, n: int = 3, **config) -> Frontend:
    return Frontend(FakeReplica(n), AppConfig(model=str(qwen3_dir), **config))


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


def test_stream_then_duplicate_then_abort(qwen3_dir):
    fe = frontend(qwen3_dir, n=5)

    async def run():
        stream = await fe.open(request(request_id="r"))
        with pytest.raises(DuplicateRequestError):
            await fe.open(request(request_id="r"))
        events = stream.events()
        first = await events.__anext__()
        assert fe.abort("r") and not fe.abort("r")
        rest = [e async for e in events]
        return first, rest

    first, rest = asyncio.run(run())
    assert first.text == "t0" and rest[-1].finish_reason == "abort" and rest[-1].completion_tokens == 1
    assert fe.inflight == {} and fe.aborted == set()


def test_finished_stream_leaves_nothing_behind(qwen3_dir):
    fe = frontend(qwen3_dir, n=3)

    async def run():
        stream = await fe.open(request())
        return [e async for e in stream.events()]

    events = asyncio.run(run())
    assert [e.text for e in events] == ["t0", "t1", "t2"] and events[-1].finished
    assert fe.inflight == {} and not fe.replica.sources[0].cancelled
