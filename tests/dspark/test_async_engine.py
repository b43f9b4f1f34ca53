"""AsyncEngine streams deltas, aborts abandoned requests, and fails in-flight requests on shutdown."""

from __future__ import annotations

import asyncio

import pytest

from dspark import LLM, AdmissionError, AsyncEngine, EngineDeadError, InvalidRequestError, SamplingParams
from dspark.config import EngineConfig

PARAMS = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
PROMPTS = ["import sys\n", "class Wrapper:\n    def", "x = [1, 2, 3]"]


@pytest.fixture(scope="module")
def offline(qwen3_dir):
    return LLM(str(qwen3_dir), num_kv_pages=64, kv_page_size=8).generate(PROMPTS, PARAMS)


async def collect(engine: AsyncEngine, prompt: str):
    tokens, text, last = [], "", None
    async for out in engine.generate(prompt, PARAMS):
        tokens += out.delta_token_ids
        text += out.delta_text
        last = out
    return tokens, text, last


def test_concurrent_streams_equal_offline(qwen3_dir, offline):
    engine = AsyncEngine(EngineConfig(model=str(qwen3_dir), drafter="ngram", num_kv_pages=64, kv_page_size=8))

    async def main():
        return await asyncio.gather(*(collect(engine, p) for p in PROMPTS))

    try:
        results = asyncio.run(main())
    finally:
        engine.shutdown()
    for (tokens, text, last), expected in zip(results, offline):
        assert tokens == expected.token_ids == last.token_ids
        assert text == expected.text == last.text
        assert last.finished and last.finish_reason == "length"


def test_errors_surface_and_abandoned_stream_aborts(qwen3_dir):
    engine = AsyncEngine(EngineConfig(model=str(qwen3_dir), num_kv_pages=8, kv_page_size=8))

    async def main():
        with pytest.raises(InvalidRequestError, match="prompt"):
            async for _ in engine.generate("", PARAMS):
                pass
        with pytest.raises(AdmissionError, match="KV cache"):
            async for _ in engine.generate("hello", SamplingParams(max_tokens=100)):
                pass
        stream = engine.generate("hello there", SamplingParams(max_tokens=40, ignore_eos=True))
        first = await stream.__anext__()
        assert first.delta_token_ids
        await stream.aclose()  # the client went away mid-stream
        for _ in range(200):  # poll with a bound: the abort is processed between steps
            if engine.call(lambda e: not e.has_unfinished() and e.pages.num_free_pages == 8):
                return True
            await asyncio.sleep(0.01)
        return False

    try:
        assert asyncio.run(main())
        assert engine.stats.aborted_requests == 1
    finally:
        engine.shutdown()


def test_shutdown_fails_in_flight_requests(qwen3_dir):
    engine = AsyncEngine(EngineConfig(model=str(qwen3_dir), num_kv_pages=64, kv_page_size=8))

    async def main():
        stream = engine.generate("hello", SamplingParams(max_tokens=400, ignore_eos=True))
        await stream.__anext__()
        engine.shutdown()
        with pytest.raises(EngineDeadError):
            async for _ in stream:
                pass

    asyncio.run(main())
    assert not engine.is_healthy()


def test_a_step_wakes_each_event_loop_once_for_all_its_streams(qwen3_dir, offline, monkeypatch):
    """Every stream's output of a step reaches its event loop in one wake-up, not one per stream."""
    from dspark import async_engine

    batches: list[int] = []
    put_all = async_engine._put_all

    def counted(batch):
        batches.append(len(batch))
        put_all(batch)

    monkeypatch.setattr(async_engine, "_put_all", counted)
    engine = AsyncEngine(EngineConfig(model=str(qwen3_dir), drafter="ngram", num_kv_pages=64, kv_page_size=8))

    async def outputs(prompt: str) -> list:
        return [out async for out in engine.generate(prompt, PARAMS)]

    async def main():
        return await asyncio.gather(*(outputs(p) for p in PROMPTS))

    try:
        streams = asyncio.run(main())
        steps = engine.stats.steps
    finally:
        engine.shutdown()
    for outs, expected in zip(streams, offline):
        assert [t for out in outs for t in out.delta_token_ids] == expected.token_ids
        assert "".join(out.delta_text for out in outs) == expected.text
    # Each output travelled in a batch, at most one batch per step, and some step served all three.
    assert sum(batches) == sum(len(outs) for outs in streams)
    assert len(batches) <= steps and max(batches) == len(PROMPTS)


def test_a_caller_gone_while_admitted_leaves_nothing_running(qwen3_dir):
    """`open` cancelled before the engine thread admitted the request: the request never runs on."""
    import threading

    engine = AsyncEngine(EngineConfig(model=str(qwen3_dir), num_kv_pages=64, kv_page_size=8))
    release = threading.Event()

    async def main():
        held = asyncio.wrap_future(engine.submit(lambda e: release.wait(30)))  # no inbox drained meanwhile
        opening = asyncio.get_running_loop().create_task(
            engine.open("hello", SamplingParams(max_tokens=400, ignore_eos=True), "gone", asyncio.Queue())
        )
        await asyncio.sleep(0)  # the add is queued behind the held call
        opening.cancel()
        with pytest.raises(asyncio.CancelledError):
            await opening
        release.set()
        await held
        for _ in range(200):  # poll with a bound: add then abort, processed in order between steps
            if engine.call(lambda e: not e.has_unfinished() and e.pages.num_free_pages == 64):
                return True
            await asyncio.sleep(0.01)
        return False

    try:
        assert asyncio.run(main())
        # Aborted as soon as it was admitted: it did not run its 400 tokens to the end.
        assert engine.stats.aborted_requests == 1 and engine.stats.finished_requests == 0
    finally:
        engine.shutdown()
