"""One multiplexed stream per (ingress replica, target replica) pair: the bookkeeping on both ends.

Every Ray message costs both processes a fixed amount of CPU (Serve's streaming-generator plumbing,
Ray core's report and receive threads), whatever it carries. With one stream per request, an engine
step that advances 8 requests sends 8 messages to the same ingress; here each request's events after
the first travel on its ingress's *subscription* to the replica, and a step's events of all of them
travel as one message. Nothing waits to be batched: the subscription sends whatever is queued each
time it runs, and a step's streams all queue before it runs (one event-loop wake-up per step).

The pieces, none of them touching Ray (deployments/replica.py and deployments/mux_client.py do):
- `Outbox` (replica side, one per ingress channel): the streams registered to it, what they queued,
  and the subscription draining it (`batches`), which ends once no stream is registered and nothing
  is queued, so a replica with no requests has no call in flight (Serve's graceful shutdown waits
  for in-flight calls). A socket subscription (deployments/mux_socket.py) lingers `linger_s` before
  it ends: back-to-back requests (concurrency 1) then reuse it rather than connect once each.
- `Outboxes`: a replica's outboxes by channel id.
- `Demux` (ingress side, one per ingress replica): its streams, each with its queue, fed by
  `deliver(message, replica_id)` from any subscription, or failed together when a replica's breaks
  (`fail`).

The first event. It always travels on the request's own call (which also carries the replica's id and
address, and any refusal). When the ingress' subscription to the replica is open at that moment (other
streams run there, or it lingers after the previous request), the event is also queued on it, as kind
FIRST: that path is one socket write away from the ingress, against Serve's and Ray core's several
thread hops for the call's message, so the ingress takes whichever copy arrives first (`Demux.first`)
and drops the other (time to first token).

Wire format: a message is msgpack of a flat list [key, kind, payload, key, kind, payload, ...], the
payload an event's own bytes (events.StreamEvent.to_wire; kind LAST for a stream's last one, FIRST for
a copy of its first) or a pickled exception (kind ERROR: what ended a request after its first event).
"""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import AsyncIterator, Callable

import msgpack

COUNTS = ("subscriptions", "messages", "events", "first_copies")
# an event, the error that ended a stream, its last event, a copy of its first
EVENT, ERROR, LAST, FIRST = 0, 1, 2, 3


class MisroutedError(RuntimeError):
    """A subscription reached a replica other than the one it was pinned to (the ingress retries)."""


def pack_error(exc: BaseException) -> bytes:
    """An exception as bytes; one that cannot be pickled as a RuntimeError naming it."""
    try:
        return pickle.dumps(exc)
    except Exception:
        return pickle.dumps(RuntimeError(f"{type(exc).__name__}: {exc}"))


def pack_first(replica_id: str, event: bytes, address: tuple[str, int, str] | None = None) -> bytes:
    """A muxed request's first message: its first event, the replica to subscribe to and, with the
    socket transport (deployments/mux_socket.py), where it listens."""
    return msgpack.packb((replica_id, event, address))


def unpack_first(message: bytes) -> tuple[str, bytes, tuple[str, int, str] | None]:
    replica_id, event, address = msgpack.unpackb(message)
    return replica_id, event, None if address is None else tuple(address)


class Outbox:
    """What one ingress' streams queued on this replica, until its subscription takes it."""

    def __init__(self, counts: dict[str, int] | None = None) -> None:
        self._counts = counts if counts is not None else dict.fromkeys(COUNTS, 0)
        self._streams: set[str] = set()
        self._queued: list = []  # flat [key, kind, payload, ...]
        self._ready = asyncio.Event()
        self._reader = 0  # the subscription now reading; a newer one takes over from an older

    def open(self, key: str) -> None:
        """Register a stream whose events will be queued here (before its first event goes out)."""
        self._streams.add(key)

    def put(self, key: str, payload: bytes, kind: int = EVENT) -> None:
        self._queued += (key, kind, payload)
        self._ready.set()

    def copy_first(self, key: str, payload: bytes) -> bool:
        """Queue a copy of a stream's first event if a subscription is reading (module docstring)."""
        if not self._reader:
            return False
        self.put(key, payload, FIRST)
        self._counts["first_copies"] += 1
        return True

    def close(self, key: str) -> None:
        """The stream queues nothing more (its last event, if any, is queued)."""
        self._streams.discard(key)
        self._ready.set()  # a subscription with nothing left to wait for ends

    @property
    def idle(self) -> bool:
        """Nothing registered, nothing queued, no subscription reading: the outbox can go."""
        return not self._streams and not self._queued and not self._reader

    async def batches(self, linger_s: float = 0.0) -> AsyncIterator[bytes]:
        """The subscription: each wake-up's queued events as one message, until no stream is open
        and nothing is queued for `linger_s` (or a newer subscription takes over)."""
        self._reader += 1
        me = self._reader
        self._ready.set()  # an older subscription still waiting wakes up and ends
        try:
            while me == self._reader:
                if self._queued:
                    queued, self._queued = self._queued, []
                    self._counts["messages"] += 1
                    self._counts["events"] += len(queued) // 3
                    yield msgpack.packb(queued)
                    continue
                self._ready.clear()
                if self._streams:
                    await self._ready.wait()
                    continue
                if linger_s <= 0:
                    return
                try:
                    await asyncio.wait_for(self._ready.wait(), linger_s)
                except asyncio.TimeoutError:
                    if not self._streams and not self._queued:
                        return
        finally:
            if me == self._reader:
                self._reader = 0


END = object()  # put into a relayed request's queue once its stream has ended (Relay)


class Relay:
    """A muxed request's outputs taken from the engine straight to its ingress' outbox.

    The engine is given the Relay as the request's queue (it only calls `put_nowait`, on the replica's
    event loop, in the one callback that delivers a whole step). Until `attach`, outputs go into
    `queue`, where the request's task reads its first event; after it, each output is made an event
    (`convert`) and queued in the outbox at once, so no task wakes per stream per step: the
    subscription wakes once and takes the step's events of every stream. The request's task waits
    for END in `queue` (and forwards what else arrives there: an abort's signal, `aborted`)."""

    def __init__(self, queue: asyncio.Queue, convert: Callable[[object], object], aborted: object) -> None:
        self.queue = queue
        self._convert = convert  # an engine output as a StreamEvent; errors and `aborted` pass as they are
        self._aborted = aborted
        self._outbox: Outbox | None = None
        self._key = ""
        self.last = None  # the last event sent (an abort ends the stream with its totals)
        self.ended = False  # the last event, the error or the abort went out (or the task left)
        self.was_aborted = False
        self.error: BaseException | None = None

    def put_nowait(self, item: object) -> None:
        if self._outbox is None:
            self.queue.put_nowait(item)
        elif not self.ended:
            self._forward(item)

    def attach(self, outbox: Outbox, key: str, last, held: object | None = None) -> None:
        """From now on the outputs go to `outbox` under `key`, `last` being the event sent before:
        first `held` (an error or abort that arrived behind it), then what queued meanwhile."""
        self._outbox, self._key, self.last = outbox, key, last
        if held is not None:
            self._forward(held)
        while not self.ended and not self.queue.empty():
            self._forward(self.queue.get_nowait())

    def close(self) -> None:
        """The request's task left: nothing more goes out."""
        self.ended = True

    def _forward(self, item: object) -> None:
        if item is self._aborted:
            self.was_aborted = True
            self._end(self.last.aborted().to_wire(), LAST)
        elif isinstance(item, BaseException):
            self.error = item
            self._end(pack_error(item), ERROR)
        else:
            event = self._convert(item)
            self.last = event
            if event.finished:
                self._end(event.to_wire(), LAST)
            else:
                self._outbox.put(self._key, event.to_wire())

    def _end(self, payload: bytes, kind: int) -> None:
        self._outbox.put(self._key, payload, kind)
        self.ended = True
        self.queue.put_nowait(END)


class Outboxes:
    """A replica's outboxes by ingress channel id (asyncio, one event loop)."""

    def __init__(self) -> None:
        self._by_channel: dict[str, Outbox] = {}
        # Since start: subscriptions served, the messages they sent and the events those carried.
        self.counts = dict.fromkeys(COUNTS, 0)

    def __getitem__(self, channel: str) -> Outbox:
        box = self._by_channel.get(channel)
        if box is None:
            box = self._by_channel[channel] = Outbox(self.counts)
        return box

    def release(self, channel: str) -> None:
        """Forget the channel's outbox once it is idle (a later stream makes a new one)."""
        box = self._by_channel.get(channel)
        if box is not None and box.idle:
            del self._by_channel[channel]

    def __len__(self) -> int:
        return len(self._by_channel)

    async def subscribe(self, channel: str, linger_s: float = 0.0) -> AsyncIterator[bytes]:
        self.counts["subscriptions"] += 1
        try:
            async for message in self[channel].batches(linger_s):
                yield message
        finally:
            self.release(channel)


class Demux:
    """An ingress' muxed streams: key -> its queue of events (bytes) or the error that ended it.

    A stream is registered before its request is sent: its later events travel on the subscription,
    which may deliver them before the first event (on the request's own call) has arrived. Once the
    first event names the replica (`placed`), the stream is among those a broken subscription to that
    replica fails."""

    def __init__(self) -> None:
        self._queues: dict[str, asyncio.Queue] = {}
        self._first: dict[str, asyncio.Future] = {}  # key -> (replica id, first event), until it arrives
        self._on: dict[str, set[str]] = {}  # replica id -> keys of the streams placed there
        self._replica_of: dict[str, str] = {}

    def register(self, key: str) -> asyncio.Queue:
        queue = self._queues[key] = asyncio.Queue()
        return queue

    def first(self, key: str) -> asyncio.Future:
        """Resolves to (replica id, event bytes) when a copy of the stream's first event arrives on a
        subscription; cancel it once the request's call delivered the first event."""
        future = self._first[key] = asyncio.get_running_loop().create_future()
        return future

    def placed(self, key: str, replica_id: str) -> None:
        if key in self._queues:
            self._replica_of[key] = replica_id
            self._on.setdefault(replica_id, set()).add(key)

    def unregister(self, key: str) -> None:
        self._queues.pop(key, None)
        first = self._first.pop(key, None)
        if first is not None:
            first.cancel()
        replica_id = self._replica_of.pop(key, None)
        if replica_id is not None:
            keys = self._on[replica_id]
            keys.discard(key)
            if not keys:
                del self._on[replica_id]

    def running_on(self, replica_id: str) -> int:
        return len(self._on.get(replica_id, ()))

    def __len__(self) -> int:
        return len(self._queues)

    def deliver(self, message: bytes, replica_id: str) -> None:
        """Hand each event of a subscription message (from replica `replica_id`) to its stream's queue;
        a stream that left (its client disconnected) is skipped, and so is a first event's copy that
        came second."""
        flat = msgpack.unpackb(message)
        queues = self._queues
        for i in range(0, len(flat), 3):
            key, kind, payload = flat[i], flat[i + 1], flat[i + 2]
            if kind == FIRST:
                first = self._first.pop(key, None)
                if first is not None and not first.done():
                    first.set_result((replica_id, payload))
                continue
            queue = queues.get(key)
            if queue is None:
                continue
            queue.put_nowait(pickle.loads(payload) if kind == ERROR else payload)
            if kind != EVENT:  # nothing follows: the stream no longer keeps a subscription open
                self.unregister(key)

    def fail(self, replica_id: str, exc: BaseException) -> None:
        """The subscription to `replica_id` broke (the replica died): its streams get `exc`."""
        for key in list(self._on.get(replica_id, ())):
            self._queues[key].put_nowait(exc)
            self.unregister(key)
