"""The ingress' end of the multiplexed streams (deployments/stream_mux.py): one subscription per target
replica that runs any of this ingress' streams, opened when the first of them starts and ended by the
replica when the last one ends (with the socket transport, once it has been idle for
mux_socket.LINGER_S, so back-to-back requests share one connection).

The request itself is placed by the app's router (any of them): its own handle call carries the first
event and this replica's id (`stream_mux.pack_first`), then stays open, sending nothing, until the
request ends, so cancelling it still aborts the request, Serve still counts it as running there (for
the routers and the autoscaler) and a replica being taken away waits for it in its drain.

With `stream_mux_transport: socket` (the default) a subscription is a TCP connection to the replica
(deployments/mux_socket.py), whose address the first event carries: no Serve call, so no router has
to place it and the autoscaler never counts it; it works with every router and under the autoscaler.

With `serve` it is a handle call pinned by our router (router/serve_router.py `pinned_replica`) rather
than a call on the replica's actor: Serve's actor protocol (pickled request metadata, slot accounting) is
internal, while a handle call is the public path and keeps Serve's bookkeeping whole; the router only
has to honour the pin. Only the SLA router honours pins, and the autoscaler would count subscriptions
as load, so that transport applies with the SLA router and a fixed replica count only
(AppConfig.stream_mux_applies); otherwise one stream per request.

Each subscription runs in a task of its own, outside any request's context: Serve would otherwise tag
it with the internal id of the request that happened to open it, and its end would count as that
request's completion for the router.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import uuid

from deployments import mux_socket, stream_mux
from deployments.errors import unwrap
from router.serve_router import PINNED

log = logging.getLogger(__name__)
MISROUTED_RETRIES = 5  # a subscription Serve handed to another replica (a rare FIFO hand-over) is re-sent


class Subscriptions:
    """This ingress' muxed streams and its subscriptions by target replica id (asyncio, one loop)."""

    def __init__(self, replica_handle, socket: bool = True) -> None:
        self.channel = uuid.uuid4().hex  # this ingress replica, as the target replicas know it
        self._handle = replica_handle.options(stream=True)
        self.socket = socket  # subscriptions on a direct connection (mux_socket), else Serve calls
        self.demux = stream_mux.Demux()
        self._tasks: dict[str, asyncio.Task] = {}
        self._addresses: dict[str, tuple[str, int, str]] = {}  # replica id -> its mux_socket address

    def register(self) -> tuple[str, asyncio.Queue]:
        """A new stream's key, and the queue its events after the first will arrive on."""
        key = uuid.uuid4().hex
        return key, self.demux.register(key)

    def first(self, key: str) -> asyncio.Future:
        """(replica id, first event bytes), if a copy of the first event comes on a subscription."""
        return self.demux.first(key)

    def placed(self, key: str, replica_id: str, address: tuple[str, int, str] | None = None) -> None:
        """Stream `key` runs on `replica_id`, listening at `address` with the socket transport (its
        first event said so): open the subscription there unless one is open."""
        self.demux.placed(key, replica_id)
        if address is not None:
            self._addresses[replica_id] = address
        if replica_id not in self._tasks and self.demux.running_on(replica_id):
            self._tasks[replica_id] = asyncio.get_running_loop().create_task(
                self._subscribe(replica_id), context=contextvars.Context()
            )

    def unregister(self, key: str) -> None:
        self.demux.unregister(key)

    async def _subscribe(self, replica_id: str) -> None:
        misrouted = 0
        deliver = functools.partial(self.demux.deliver, replica_id=replica_id)
        try:
            # The replica ends a subscription when none of our streams runs there; one placed there
            # meanwhile (its first event already sent) needs the next.
            while self.demux.running_on(replica_id):
                if self.socket:
                    address = self._addresses.get(replica_id)
                    if address is None:  # placed by its first event's copy after that subscription broke
                        raise mux_socket.StreamLostError(f"no open subscription to replica {replica_id}")
                    await mux_socket.receive(address, self.channel, replica_id, deliver)
                    continue
                source = self._handle.subscribe.remote(self.channel, **{PINNED: replica_id})
                try:
                    async for message in source:
                        deliver(message)
                except Exception as exc:
                    if isinstance(unwrap(exc), stream_mux.MisroutedError) and misrouted < MISROUTED_RETRIES:
                        misrouted += 1
                        continue
                    raise
        except Exception as exc:  # the replica died, or the subscription could not reach it
            # An idle lingering subscription that breaks (its replica stopped) costs no stream.
            level = logging.WARNING if self.demux.running_on(replica_id) else logging.INFO
            log.log(level, "subscription to replica %s broke: %r", replica_id, exc)
            self.demux.fail(replica_id, exc)
        finally:
            # No await between the last check of `running_on` and here: a stream placed later
            # starts a new task.
            del self._tasks[replica_id]
            if not self.demux.running_on(replica_id):
                self._addresses.pop(replica_id, None)
