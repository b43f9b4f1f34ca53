"""bench/load_client.py: the serving benches' load generator, sync and async, and what it costs."""

from __future__ import annotations

import asyncio
import threading

import pytest
from serving import serve_stack  # noqa: F401  (the session's shared Ray Serve stack)

from bench.load_client import Cost, LoadGen, by_thread, client_cost, sse_chunk, thread_cost, thread_costs


def test_an_sse_line_gives_its_json_chunk_and_nothing_else_does():
    assert sse_chunk(b'data: {"choices": [], "usage": {"completion_tokens": 3}}\n') == {
        "choices": [],
        "usage": {"completion_tokens": 3},
    }
    assert sse_chunk(b'data:{"choices": [{"text": "a"}]}') == {"choices": [{"text": "a"}]}
    for line in (b"\n", b"", b": keep-alive\n", b"data: [DONE]\n", b"event: x\n"):
        assert sse_chunk(line) is None


def test_an_sse_error_event_raises_with_its_message():
    with pytest.raises(RuntimeError, match="overloaded"):
        sse_chunk(b'data: {"error": {"message": "overloaded"}}\n')


def test_a_client_kind_must_be_sync_or_async():
    with pytest.raises(ValueError, match="client must be one of"):
        LoadGen("threads", asyncio.new_event_loop(), "http://x", "x:1", "m", 1)


def test_the_cost_counts_an_ended_threads_wakeups_and_leaves_out_the_skipped_thread():
    # A thread that wakes 50 times and ends before the reading (a sync run's pool thread does) is
    # still counted; the skipped thread's own wake-ups are not.
    skipped_go, skipped_done, release = threading.Event(), threading.Event(), threading.Event()
    skipped_tids: list[int] = []

    def skipped():
        skipped_tids.append(threading.get_native_id())
        skipped_go.wait()
        for _ in range(200):
            threading.Event().wait(0.0005)  # a timed sleep: one voluntary switch each
        skipped_done.set()
        release.wait()  # alive until read: /proc has no task directory for an ended thread

    def ended():
        for _ in range(50):
            threading.Event().wait(0.0005)

    parked = threading.Thread(target=skipped)
    parked.start()
    while not skipped_tids:
        threading.Event().wait(0.001)
    tid = skipped_tids[0]
    before, skipped_before = client_cost(tid), thread_cost(tid)
    worker = threading.Thread(target=ended)
    worker.start()
    worker.join()
    skipped_go.set()
    skipped_done.wait(10)
    spent, skipped_spent = client_cost(tid) - before, thread_cost(tid) - skipped_before
    release.set()
    parked.join()
    assert skipped_spent.wakeups >= 200
    # the ended thread's 50, plus this thread's few waits; none of the skipped thread's 200
    assert 50 <= spent.wakeups < 200
    assert spent.per_token(10)["client_wakeups_per_token"] == spent.wakeups / 10


def test_the_breakdown_by_thread_gives_ended_threads_the_rest_of_the_total():
    before = {"main": Cost(1.0, 10, 1), "poller": Cost(0.5, 100, 0), "idle": Cost(0.1, 5, 0)}
    after = {"main": Cost(1.002, 14, 1), "poller": Cost(0.501, 120, 2), "idle": Cost(0.1, 5, 0)}
    total = Cost(0.005, 40, 5)  # the process' difference: 2 ms, 16 wake-ups and 3 preemptions more
    assert by_thread(before, after, total, 10) == {
        "(ended)": [200.0, 1.6, 0.3],
        "main": [200.0, 0.4, 0.0],
        "poller": [100.0, 2.0, 0.2],
    }


def test_the_live_threads_are_named_and_the_skipped_one_left_out():
    costs = thread_costs(skip_tid=-1)
    assert "main" in costs
    assert costs["main"].wakeups >= 0 and costs["main"].cpu_s > 0
    assert "main" not in thread_costs(skip_tid=threading.get_native_id())  # pytest runs on the main thread


@pytest.mark.parametrize("surface", ["http", "grpc"])
def test_sync_and_async_clients_time_the_same_streams_alike(serve_stack, surface):  # noqa: F811
    # The same greedy, fixed-length requests through each load generator: every request its full
    # token count, at least one message and no more messages than tokens, a TTFT within its time.
    prompts = ["def add(a, b):", "The river", "import os"]
    loop = asyncio.new_event_loop()
    stack, got = serve_stack, {}
    for kind in ("sync", "async"):
        clients = LoadGen(kind, loop, stack.http_url, stack.grpc_target, stack.model_name, 6)
        try:
            got[kind], wall = clients.run(surface, prompts, 2)
        finally:
            clients.close()
        assert [s.tokens for s in got[kind]] == [6, 6, 6]
        for sample in got[kind]:
            assert 1 <= sample.messages <= sample.tokens
            assert 0 < sample.ttft <= sample.seconds <= wall
    loop.close()
