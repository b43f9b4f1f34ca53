"""A target replica in-process (no Ray): the client's request id is a label, Abort ends what runs under it.

Requests that share a label run under engine ids of their own and stream apart; `abort(label)` ends
every one of them with finish_reason "abort" and frees its KV pages.
"""

from __future__ import annotations

import asyncio
import threading

import pytest
from serving import ENGINE, decoded

from deployments.replica import TargetReplica
from deployments.running import RunningRequests
from dspark import LLM
from dspark.sampling_params import SamplingParams

LONG = SamplingParams(temperature=1.0, max_tokens=480, ignore_eos=True)  # cannot finish during a test
GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)


@pytest.fixture
def replica(qwen3_dir):
    replica = TargetReplica.func_or_class({"model": str(qwen3_dir), "engine": dict(ENGINE)})
    yield replica
    replica.__del__()


def ids(replica, text: str) -> list[int]:
    return replica.engine.engine.tokenize(text)


async def drain(stream) -> list:
    return [event async for event in stream]


def test_abort_ends_every_request_under_the_label_and_only_those(replica):
    resume = threading.Event()

    def hold(engine) -> None:  # runs on the engine thread: no step happens until `resume`
        resume.wait(60)

    async def run():
        streams = [
            decoded(replica.generate(ids(replica, "def f(x):"), LONG, "dup")),
            decoded(replica.generate(ids(replica, "import os\n"), LONG, "dup")),
            decoded(replica.generate(ids(replica, "class A:"), LONG, "other")),
        ]
        firsts = await asyncio.gather(*(s.__anext__() for s in streams))
        # Hold the engine so that no request can finish on its own before the abort lands.
        holding = asyncio.wrap_future(replica.engine.submit(hold))
        assert await replica.abort("dup") == 2
        assert await replica.abort("dup") == 0  # idempotent: nothing left under that label
        assert await replica.abort("unknown") == 0
        ended = [await drain(s) for s in streams[:2]]
        resume.set()
        await holding
        running = await replica.engine.call_async(lambda e: sorted(e.seqs))
        other = await streams[2].__anext__()  # the third request keeps going
        await streams[2].aclose()
        return firsts, ended, running, other

    firsts, ended, running, other = asyncio.run(run())
    for first, rest in zip(firsts, ended):
        last = rest[-1]
        assert last.finish_reason == "abort" and last.finished and not last.token_ids
        received = len(first.token_ids) + sum(len(e.token_ids) for e in rest)
        assert last.completion_tokens == received
    assert len(running) == 1 and running[0].startswith("other.")  # engine ids: label plus a suffix
    assert other.finish_reason is None  # still running
    pages = replica.engine.call(lambda e: (e.pages.num_unreserved_pages, e.pages.num_pages))
    assert pages[0] == pages[1]  # every KV page is back


def test_requests_sharing_a_label_stream_apart(replica, qwen3_dir):
    prompts = ["def wrap(text, width):", "import bisect\n"]
    expected = [out.token_ids for out in LLM(str(qwen3_dir), **ENGINE).generate(prompts, GREEDY)]

    async def run():
        return await asyncio.gather(
            *(drain(decoded(replica.generate(ids(replica, p), GREEDY, "same"))) for p in prompts)
        )

    streams = asyncio.run(run())
    for events, want in zip(streams, expected):
        assert [t for e in events for t in e.token_ids] == want
        assert events[-1].finish_reason == "length"


def test_running_requests_registry():
    async def run():
        running = RunningRequests()
        a, b, c = asyncio.Queue(), asyncio.Queue(), asyncio.Queue()
        running.add("x", a)
        running.add("x", b)
        running.add("y", c)
        running.discard("x", b)  # finished before the abort
        count = running.abort("x")
        running.discard("x", a)  # the aborted request ends later: a no-op
        return count, a.qsize(), b.qsize(), c.qsize(), running.abort("y")

    assert asyncio.run(run()) == (1, 1, 0, 0, 1)
