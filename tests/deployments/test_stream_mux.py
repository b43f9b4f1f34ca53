"""The multiplexed streams' bookkeeping without Ray (deployments/stream_mux.py): a replica's outboxes and
their subscriptions, an ingress' demultiplexer, and the first message's framing."""

from __future__ import annotations

import asyncio
import pickle

import msgpack

from deployments.events import StreamEvent
from deployments.running import ABORTED
from deployments.stream_mux import (
    END,
    ERROR,
    FIRST,
    LAST,
    Demux,
    MisroutedError,
    Outboxes,
    Relay,
    pack_error,
    pack_first,
    unpack_first,
)
from dspark.errors import AdmissionError
from dspark.outputs import SpeculationStats


async def drain(subscription) -> list[bytes]:
    return [message async for message in subscription]


def flat(message: bytes) -> list:
    return msgpack.unpackb(message)


def test_a_wake_ups_events_of_every_stream_travel_as_one_message_in_order():
    async def run():
        boxes = Outboxes()
        box = boxes["ingress-1"]
        box.open("a")
        box.open("b")
        reader = asyncio.ensure_future(drain(boxes.subscribe("ingress-1")))
        await asyncio.sleep(0)  # the subscription waits for events
        box.put("a", b"a1")
        box.put("b", b"b1")
        box.put("a", b"a2")
        await asyncio.sleep(0)  # one wake-up: all three go together
        box.put("a", b"a3", LAST)
        box.close("a")
        box.put("b", b"b2", LAST)
        box.close("b")
        return await asyncio.wait_for(reader, 5), boxes

    messages, boxes = asyncio.run(run())
    assert [flat(m) for m in messages] == [
        ["a", 0, b"a1", "b", 0, b"b1", "a", 0, b"a2"],
        ["a", LAST, b"a3", "b", LAST, b"b2"],
    ]
    # The subscription ended once no stream was open and nothing was queued; the outbox is gone.
    assert len(boxes) == 0
    assert boxes.counts == {"subscriptions": 1, "messages": 2, "events": 5, "first_copies": 0}


def test_what_was_queued_before_a_subscription_or_between_two_is_delivered():
    async def run():
        boxes = Outboxes()
        box = boxes["c"]
        box.open("a")
        box.put("a", b"a1")  # before any subscription
        first = boxes.subscribe("c")
        got = [await first.__anext__()]
        box.put("a", b"a2", LAST)
        box.close("a")
        got += await drain(first)
        assert len(boxes) == 0  # a later stream makes the outbox again; its events wait for the next one
        box = boxes["c"]
        box.open("b")
        box.put("b", b"b1", LAST)
        box.close("b")
        got += await drain(boxes.subscribe("c"))
        return got, boxes

    got, boxes = asyncio.run(run())
    assert [flat(m) for m in got] == [["a", 0, b"a1"], ["a", LAST, b"a2"], ["b", LAST, b"b1"]]
    assert len(boxes) == 0


def test_an_outbox_with_no_stream_left_is_kept_while_it_holds_events():
    async def run():
        boxes = Outboxes()
        box = boxes["c"]
        box.open("a")
        box.put("a", b"last", LAST)
        box.close("a")
        boxes.release("c")  # the stream's end: its last event still waits for the subscription
        kept = len(boxes)
        return kept, await drain(boxes.subscribe("c")), len(boxes)

    kept, got, after = asyncio.run(run())
    assert kept == 1 and [flat(m) for m in got] == [["a", LAST, b"last"]] and after == 0


def test_a_newer_subscription_takes_over_from_an_older_one_waiting():
    async def run():
        boxes = Outboxes()
        boxes["c"].open("a")
        old = asyncio.ensure_future(drain(boxes.subscribe("c")))
        await asyncio.sleep(0)
        new = boxes.subscribe("c")
        pending = asyncio.ensure_future(new.__anext__())
        await asyncio.sleep(0)
        old_got = await asyncio.wait_for(old, 5)  # ended, without taking anything
        boxes["c"].put("a", b"a1", LAST)
        boxes["c"].close("a")
        new_got = [await asyncio.wait_for(pending, 5)] + await drain(new)
        return old_got, new_got

    old_got, new_got = asyncio.run(run())
    assert old_got == [] and [flat(m) for m in new_got] == [["a", LAST, b"a1"]]


def test_a_lingering_subscription_carries_the_next_stream_then_ends_once_idle_for_its_linger():
    async def run():
        loop = asyncio.get_running_loop()
        boxes = Outboxes()
        box = boxes["c"]
        box.open("a")
        assert not box.copy_first("a", b"a0")  # no subscription reads yet: the first goes on its call only
        subscription = boxes.subscribe("c", linger_s=0.2)
        box.put("a", b"a1", LAST)
        box.close("a")
        got = [await subscription.__anext__()]
        # Idle now, the subscription stays: the next stream's first event is copied onto it at once.
        box.open("b")
        assert box.copy_first("b", b"b0")
        got.append(await asyncio.wait_for(subscription.__anext__(), 5))
        box.put("b", b"b1", LAST)
        box.close("b")
        got.append(await subscription.__anext__())
        idle_from = loop.time()
        got += await asyncio.wait_for(drain(subscription), 5)  # nothing more: it ends after its linger
        return got, loop.time() - idle_from, boxes

    got, idle_s, boxes = asyncio.run(run())
    assert [flat(m) for m in got] == [["a", LAST, b"a1"], ["b", FIRST, b"b0"], ["b", LAST, b"b1"]]
    assert 0.2 <= idle_s < 5
    assert len(boxes) == 0 and boxes.counts["first_copies"] == 1 and boxes.counts["subscriptions"] == 1


def test_a_first_events_copy_resolves_its_stream_once_and_is_never_queued():
    async def run():
        demux = Demux()
        qa, qb = demux.register("a"), demux.register("b")
        first_a, first_b = demux.first("a"), demux.first("b")
        first_b.cancel()  # b's own call delivered its first event: the copy that follows is dropped
        demux.deliver(msgpack.packb(["a", FIRST, b"a1", "b", FIRST, b"b1", "a", 0, b"a2"]), "r1")
        demux.deliver(msgpack.packb(["a", FIRST, b"again"]), "r1")
        demux.register("c")
        first_c = demux.first("c")
        demux.unregister("c")  # a stream that ends (refused) cancels its wait for a copy
        return qa, qb, first_a, first_c

    qa, qb, first_a, first_c = asyncio.run(run())
    assert first_a.result() == ("r1", b"a1") and first_c.cancelled()
    assert qa.get_nowait() == b"a2" and qa.empty() and qb.empty()


def test_demux_hands_events_to_their_streams_and_skips_streams_that_left():
    async def run():
        demux = Demux()
        qa, qb = demux.register("a"), demux.register("b")
        demux.register("gone")
        demux.unregister("gone")
        # b's later events overtake its first: they wait in its queue before it is placed.
        demux.deliver(msgpack.packb(["b", 0, b"b2", "gone", 0, b"x", "a", 0, b"a2"]), "r1")
        demux.placed("a", "r1")
        demux.placed("b", "r1")
        assert demux.running_on("r1") == 2
        refused = pack_error(AdmissionError("full", 2.0))
        demux.deliver(msgpack.packb(["a", LAST, b"a3", "b", ERROR, refused]), "r1")
        return qa, qb, demux

    qa, qb, demux = asyncio.run(run())
    assert [qa.get_nowait(), qa.get_nowait()] == [b"a2", b"a3"]
    assert qb.get_nowait() == b"b2"
    error = qb.get_nowait()
    assert isinstance(error, AdmissionError) and error.retry_after_s == 2.0 and str(error) == "full"
    # Nothing follows a last event or an error: neither stream keeps the subscription open.
    assert demux.running_on("r1") == 0 and len(demux) == 0


def test_a_broken_subscription_fails_only_its_replicas_streams():
    async def run():
        demux = Demux()
        queues = {key: demux.register(key) for key in ("a", "b", "c")}
        demux.placed("a", "r1")
        demux.placed("b", "r2")  # c is not placed yet: its own call reports its replica's fate
        demux.fail("r1", ConnectionError("replica r1 died"))
        return queues, demux

    queues, demux = asyncio.run(run())
    assert isinstance(queues["a"].get_nowait(), ConnectionError)
    assert queues["b"].empty() and queues["c"].empty()
    assert demux.running_on("r1") == 0 and demux.running_on("r2") == 1 and len(demux) == 2


def test_errors_and_first_messages_travel_exactly():
    class Local(Exception):  # a class pickle cannot find by name
        pass

    unpicklable = pickle.loads(pack_error(Local("boom")))
    assert type(unpicklable) is RuntimeError and str(unpicklable) == "Local: boom"
    misrouted = pickle.loads(pack_error(MisroutedError("to r2")))
    assert type(misrouted) is MisroutedError and str(misrouted) == "to r2"
    assert unpack_first(pack_first("r1", b"\x00event")) == ("r1", b"\x00event", None)
    assert unpack_first(pack_first("r1", b"e", ("10.0.0.2", 4711, "tok"))) == (
        "r1",
        b"e",
        ("10.0.0.2", 4711, "tok"),
    )


def event(i: int, finished: bool = False) -> StreamEvent:
    reason = "length" if finished else None
    return StreamEvent("r", f"t{i}", (i,), finished, reason, 3, i + 1, SpeculationStats(i, 0, 0, 1.0))


def relayed(script) -> tuple[list, list, Relay]:
    """Run `script(relay, outbox)` on a relay into one outbox; (what the outbox sent as [kind,
    event or error], what stayed in the relay's queue, the relay)."""

    async def run():
        boxes = Outboxes()
        box = boxes["c"]
        box.open("k")
        queue: asyncio.Queue = asyncio.Queue()
        relay = Relay(queue, lambda item: item, ABORTED)
        script(relay, box)
        box.close("k")
        sent = [m for message in await drain(boxes.subscribe("c")) for m in flat(message)]
        left = [queue.get_nowait() for _ in range(queue.qsize())]
        return sent, left, relay

    sent, left, relay = asyncio.run(run())
    items = []
    for key, kind, payload in zip(sent[::3], sent[1::3], sent[2::3]):
        assert key == "k"
        items.append([kind, pickle.loads(payload) if kind == ERROR else StreamEvent.from_wire(payload)])
    return items, left, relay


def test_a_relay_queues_until_attached_then_sends_each_output_at_once_in_order():
    def script(relay, box):
        relay.put_nowait(event(0))  # the first event: the request's task reads it from the queue
        first = relay.queue.get_nowait()
        relay.put_nowait(event(1))  # arrived while the first was on its way
        relay.attach(box, "k", first)
        relay.put_nowait(event(2))
        relay.put_nowait(event(3, finished=True))
        relay.put_nowait(event(4))  # nothing follows the last event

    items, left, relay = relayed(script)
    assert items == [[0, event(1)], [0, event(2)], [LAST, event(3, finished=True)]]
    assert left == [END] and relay.ended and not relay.was_aborted and relay.error is None


def test_a_relay_ends_an_aborted_stream_with_the_totals_sent_so_far():
    def script(relay, box):
        relay.attach(box, "k", event(0))
        relay.put_nowait(event(1))
        relay.put_nowait(ABORTED)

    items, left, relay = relayed(script)
    assert items == [[0, event(1)], [LAST, event(1).aborted()]]
    assert left == [END] and relay.was_aborted


def test_a_relay_sends_an_error_held_behind_the_first_event_and_nothing_after():
    def script(relay, box):
        relay.put_nowait(event(1))  # behind the held error (the task took all before it): never sent
        relay.attach(box, "k", event(0), held=AdmissionError("engine full", 3.0))
        relay.put_nowait(event(2))

    items, left, relay = relayed(script)
    assert [kind for kind, _ in items] == [ERROR]
    assert isinstance(items[0][1], AdmissionError) and items[0][1].retry_after_s == 3.0
    assert relay.error is not None and left == [event(1), END]


def test_a_relay_whose_task_left_sends_nothing_more():
    def script(relay, box):
        relay.attach(box, "k", event(0))
        relay.put_nowait(event(1))
        relay.close()
        relay.put_nowait(event(2))

    items, left, _ = relayed(script)
    assert items == [[0, event(1)]] and left == []
