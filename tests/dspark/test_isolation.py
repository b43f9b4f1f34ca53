"""One request never hurts another: a request whose own processing fails is stopped alone, with a clear
error, while the others stream on token for token as if it had never been there; failures the engine
cannot pin on one request (or too many that it can) make it report itself unhealthy."""

from __future__ import annotations

import asyncio
import math
import threading

import pytest
import torch

from dspark import AsyncEngine, EngineDeadError, RequestFailedError, SamplingParams
from dspark.config import EngineConfig
from dspark.engine import Engine

GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
SEEDED = SamplingParams(temperature=0.8, top_p=0.9, top_k=50, seed=11, max_tokens=24, ignore_eos=True)
GOOD = [("import sys\n", GREEDY), ("class Wrapper:\n    def", SEEDED)]


def async_engine(model_dir, **options) -> AsyncEngine:
    options = {"drafter": "ngram", "num_speculative_tokens": 3, "scheduler": "fixed", **options}
    return AsyncEngine(EngineConfig(model=str(model_dir), num_kv_pages=64, kv_page_size=8, **options))


def sneaked(params: SamplingParams, **values) -> SamplingParams:
    """A copy of `params` with values validation would refuse, as a bug upstream could produce."""
    params = SamplingParams(**{**params.__dict__})
    for name, value in values.items():
        object.__setattr__(params, name, value)
    return params


def poison_logits(engine: Engine, request_id: str, after_tokens: int) -> None:
    """From the step after `request_id` has `after_tokens` tokens, NaN its rows of the target's logits."""
    forward = engine.runner.forward

    def poisoned(items, tap_layers=()):
        result = forward(items, tap_layers)
        seq = engine.seqs.get(request_id)
        if seq is not None and len(seq.output_token_ids) >= after_tokens:
            table = engine.pages.table(request_id)
            for i, item in enumerate(items):
                if item.page_table is table:  # the engine hands each item its request's own table
                    result.logits[i] = torch.full_like(result.logits[i], math.nan)
        return result

    engine.runner.forward = poisoned


async def collect(engine: AsyncEngine, prompt: str, params: SamplingParams, request_id: str | None = None):
    """(tokens streamed, the error that ended the stream or None)."""
    tokens: list[int] = []
    try:
        async for out in engine.generate(prompt, params, request_id):
            tokens += out.delta_token_ids
    except Exception as exc:
        return tokens, exc
    return tokens, None


@pytest.fixture(scope="module")
def clean(qwen3_dir):
    """The good requests on their own: what they must produce whatever else runs beside them."""
    engine = async_engine(qwen3_dir)

    async def main():
        return await asyncio.gather(*(collect(engine, p, params) for p, params in GOOD))

    try:
        results = asyncio.run(main())
    finally:
        engine.shutdown()
    assert all(error is None and len(tokens) == 24 for tokens, error in results)
    return [tokens for tokens, _ in results]


def test_poisoned_requests_fail_alone_and_the_others_are_untouched(qwen3_dir, clean):
    engine = async_engine(qwen3_dir)
    # Mid-stream: NaN logits for one request's rows only, after it streamed 5 tokens.
    poison_logits(engine.engine, "nan-logits", after_tokens=5)

    async def main():
        good = [asyncio.ensure_future(collect(engine, p, params)) for p, params in GOOD]
        nan_logits = asyncio.ensure_future(collect(engine, "x = [1, 2, 3]", SEEDED, "nan-logits"))
        # A newcomer while the others decode, whose params make its sampling raise (NaN temperature).
        while not engine.call(lambda e: e.stats.generated_tokens >= 6):
            await asyncio.sleep(0.01)
        bad_params = await collect(engine, "def f(x):", sneaked(SEEDED, temperature=math.nan))
        return await asyncio.gather(*good), await nan_logits, bad_params

    try:
        good, nan_logits, bad_params = asyncio.run(main())
        freed = engine.call(lambda e: (e.pages.num_free_pages, e.pages.num_pages, e.stats.failed_requests))
        assert engine.is_healthy()
    finally:
        engine.shutdown()
    assert [tokens for tokens, _ in good] == clean and all(error is None for _, error in good)
    tokens, error = nan_logits
    assert len(tokens) >= 5 and isinstance(error, RequestFailedError)
    assert str(error) == (
        "request nan-logits failed and was stopped: "
        "the target's logits for this request are not finite (NaN or inf)"
    )
    tokens, error = bad_params
    assert tokens == [] and isinstance(error, RequestFailedError)
    assert "failed and was stopped: internal error (RuntimeError)" in str(error)
    assert freed == (64, 64, 2)  # their KV pages came back; two failures are not the engine's fault


def test_repeated_request_failures_mark_the_engine_unhealthy(qwen3_dir):
    engine = async_engine(qwen3_dir, max_request_failures=2, failure_window_steps=50)
    bad = sneaked(GREEDY, temperature=math.nan, max_tokens=8)

    async def main():
        first = await collect(engine, "import sys\n", bad)
        healthy_after_one = engine.is_healthy()
        second = await collect(engine, "import os\n", bad)
        refused = await collect(engine, "import re\n", GREEDY)
        return first[1], healthy_after_one, second[1], refused[1]

    try:
        first, healthy_after_one, second, refused = asyncio.run(main())
        problem = engine.health_problem()
    finally:
        engine.shutdown()
    # NaN temperature is not greedy (NaN < eps is false): sampling raises, the request fails.
    assert isinstance(first, RequestFailedError) and isinstance(second, RequestFailedError)
    assert healthy_after_one
    assert problem.startswith("2 requests failed within 50 steps, the last with: request ")
    assert isinstance(refused, EngineDeadError) and "engine unhealthy" in str(refused)


def test_a_failure_no_request_owns_fails_the_batch_and_marks_the_engine_unhealthy(qwen3_dir):
    engine = async_engine(qwen3_dir)
    forward = engine.engine.runner.forward
    calls = 0

    def failing(items, tap_layers=()):
        nonlocal calls
        calls += 1
        if calls == 4:
            raise RuntimeError("device lost")
        return forward(items, tap_layers)

    engine.engine.runner.forward = failing

    async def main():
        return await asyncio.gather(*(collect(engine, p, params) for p, params in GOOD))

    try:
        results = asyncio.run(main())
        assert not engine.is_healthy()
        assert engine.health_problem() == "engine step failed: RuntimeError('device lost')"
        pages = engine.call(lambda e: (e.pages.num_free_pages, e.has_unfinished()))
    finally:
        engine.shutdown()
    for tokens, error in results:  # both were mid-stream
        assert tokens and isinstance(error, EngineDeadError) and "device lost" in str(error)
    assert pages == (64, False)


def test_tiny_temperatures_decode_greedily(qwen3_dir):
    """Below 1e-5 a temperature means greedy, as in vLLM; 1e-40 smuggled past validation included."""
    engine = Engine(EngineConfig(model=str(qwen3_dir), num_kv_pages=64, kv_page_size=8))
    outputs = {}
    for name, params in [
        ("greedy", GREEDY),
        ("1e-6", SamplingParams(temperature=1e-6, max_tokens=24, ignore_eos=True)),
        ("1e-40", sneaked(GREEDY, temperature=1e-40)),
        ("1e-300", sneaked(GREEDY, temperature=1e-300)),
    ]:
        engine.add_request("import sys\n", params, request_id=name)
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                outputs[out.request_id] = (out.token_ids, out.finish_reason)
    assert len({tuple(tokens) for tokens, _ in outputs.values()}) == 1
    assert {reason for _, reason in outputs.values()} == {"length"}


def test_call_fails_fast_and_never_waits_past_its_deadline(qwen3_dir):
    engine = async_engine(qwen3_dir, drafter="none")
    release = threading.Event()
    step = engine.engine.step

    def stalled():
        release.wait()
        return step()

    engine.engine.step = stalled

    async def main():
        stream = engine.generate("import sys\n", GREEDY)
        first = asyncio.ensure_future(anext(stream))
        while not engine.engine.has_unfinished():  # admitted: the loop is now inside the stalled step
            await asyncio.sleep(0.01)
        with pytest.raises(TimeoutError, match="did not answer within 0.05s"):
            engine.call(lambda e: e.stats.steps, timeout_s=0.05)
        with pytest.raises(TimeoutError):
            await engine.call_async(lambda e: e.stats.steps, timeout_s=0.05)
        release.set()
        await first
        return [out async for out in stream][-1].finished, engine.call(lambda e: e.stats.steps)

    try:
        finished, steps = asyncio.run(main())
    finally:
        engine.shutdown()
    assert finished and steps >= 24
    with pytest.raises(EngineDeadError, match="shut down"):
        engine.call(lambda e: e.stats.steps)
