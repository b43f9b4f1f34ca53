"""The target replica's multiplexed streams in-process (no Ray): the request's own stream carries its
first event and this replica's id, the ingress channel's subscription carries every later event of all
its streams, greedy output stays identical to the offline engine, with and without a stream interval,
and an abort by id ends the stream there with finish_reason "abort". The subscription is the replica's
`subscribe` (the "serve" transport, called directly) or a real TCP connection to its socket
(deployments/mux_socket.py, the default)."""

from __future__ import annotations

import asyncio

import pytest
from serving import ENGINE

from deployments import mux_socket
from deployments.errors import classify
from deployments.events import StreamEvent
from deployments.replica import TargetReplica
from deployments.stream_mux import Demux, MisroutedError, unpack_first
from dspark import LLM
from dspark.sampling_params import SamplingParams

PROMPTS = ["def f(x):", "class Point:"]


def muxed_streams(replica, params: list[SamplingParams], abort: str | None = None) -> tuple[dict, dict]:
    """Run one muxed request per prompt on channel "c" and read them as an ingress would: (events by
    request id, the replica's counts since start). `abort`: the request id aborted after its first event."""

    async def run():
        demux = Demux()
        firsts, calls = {}, []
        for i, (prompt, p) in enumerate(zip(PROMPTS, params)):
            rid = f"r{i}"
            queue = demux.register(rid)
            ids = replica.engine.engine.tokenize(prompt)
            calls.append((rid, queue, replica.generate(ids, p, rid, mux=("c", rid))))
        for rid, _, call in calls:
            replica_id, wire, address = unpack_first(await call.__anext__())
            assert replica_id == "local"  # outside Serve
            assert (address is None) == (replica.config.stream_mux_transport == "serve")
            firsts[rid] = StreamEvent.from_wire(wire)
            demux.placed(rid, replica_id)
        if abort is not None:
            assert await replica.abort(abort) == 1

        async def subscription():
            if address is not None:
                await mux_socket.receive(address, "c", replica_id, lambda m: demux.deliver(m, replica_id))
                return
            async for message in replica.subscribe("c", "local"):
                demux.deliver(message, "local")

        async def rest(call) -> list:
            return [item async for item in call]

        # Each request's own call is read on, as Serve does: it sends nothing more, and ends with it.
        own = [asyncio.ensure_future(rest(call)) for _, _, call in calls]
        reader = asyncio.ensure_future(subscription())
        events = {}
        for rid, queue, _ in calls:
            events[rid] = [firsts[rid]]
            while not events[rid][-1].finished:
                events[rid].append(StreamEvent.from_wire(await asyncio.wait_for(queue.get(), 30)))
        assert await asyncio.wait_for(asyncio.gather(*own), 30) == [[], []]
        await asyncio.wait_for(reader, 30)  # the subscription ends with the last stream
        return events, (await replica.get_state())["stream_mux"]

    return asyncio.run(run())


@pytest.mark.parametrize(("interval", "transport"), [(1, "socket"), (3, "socket"), (1, "serve")])
def test_muxed_streams_equal_offline_greedy_and_share_the_subscription(qwen3_dir, interval, transport):
    replica = TargetReplica.func_or_class(
        {
            "model": str(qwen3_dir),
            "engine": dict(ENGINE),
            "stream_interval": interval,
            "stream_mux_transport": transport,
        }
    )
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (24, 12)]
    try:
        events, counts = muxed_streams(replica, params)
    finally:
        replica.__del__()
    llm = LLM(str(qwen3_dir), **ENGINE)
    for (rid, got), prompt, p in zip(events.items(), PROMPTS, params):
        expected = llm.generate([prompt], p)[0]
        assert [t for e in got for t in e.token_ids] == expected.token_ids, rid
        assert "".join(e.text for e in got) == expected.text
        assert got[-1].finish_reason == "length" and got[-1].completion_tokens == p.max_tokens
        if interval > 1:
            assert all(len(e.token_ids) >= interval for e in got[1:-1])
    assert counts["subscriptions"] == 1 and counts["channels"] == 0
    assert counts["events"] == sum(len(got) - 1 for got in events.values())
    assert counts["messages"] < counts["events"]  # the two streams' steps travelled together


def test_an_abort_ends_a_muxed_stream_with_its_totals_and_spares_the_other(qwen3_dir):
    replica = TargetReplica.func_or_class({"model": str(qwen3_dir), "engine": dict(ENGINE)})
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (400, 12)]
    try:
        events, _ = muxed_streams(replica, params, abort="r0")
        state = asyncio.run(replica.get_state())
    finally:
        replica.__del__()
    aborted, other = events["r0"], events["r1"]
    assert aborted[-1].finish_reason == "abort" and aborted[-1].token_ids == ()
    assert aborted[-1].completion_tokens == sum(len(e.token_ids) for e in aborted) < 400
    assert other[-1].finish_reason == "length" and sum(len(e.token_ids) for e in other) == 12
    assert state["running_requests"] == 0 and state["kv_unreserved_pages"] == state["kv_total_pages"]


def test_a_subscription_that_reached_another_replica_is_refused(qwen3_dir):
    replica = TargetReplica.func_or_class({"model": str(qwen3_dir), "engine": dict(ENGINE)})

    async def run():
        async for _ in replica.subscribe("c", "some-other-replica"):
            pass

    try:
        with pytest.raises(MisroutedError):
            asyncio.run(run())
    finally:
        replica.__del__()


def test_a_socket_subscription_naming_another_replica_or_a_stale_token_is_refused(qwen3_dir):
    replica = TargetReplica.func_or_class({"model": str(qwen3_dir), "engine": dict(ENGINE)})
    delivered = []

    async def run():
        host, port, token = await replica._mux_address()
        for replica_id, offered in (("some-other-replica", token), ("local", "0" * len(token))):
            with pytest.raises(mux_socket.StreamLostError, match="refused"):
                await asyncio.wait_for(
                    mux_socket.receive((host, port, offered), "c", replica_id, delivered.append), 30
                )
        # A connection that is no client of ours is dropped; the server goes on serving.
        _, writer = await asyncio.open_connection(host, port)
        writer.write(b"\xff\xff\xff\xff")
        await writer.drain()
        writer.close()
        with pytest.raises(mux_socket.StreamLostError, match="refused"):
            await asyncio.wait_for(mux_socket.receive((host, port, "x"), "c", "local", delivered.append), 30)

    try:
        asyncio.run(run())
    finally:
        replica.__del__()
    assert delivered == []
    assert classify(mux_socket.StreamLostError("gone")).http_status == 503
