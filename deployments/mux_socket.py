"""The multiplexed streams' subscriptions on a direct TCP connection from the target replica to the
ingress replica (AppConfig.stream_mux_transport "socket"), instead of a Ray Serve streaming call.

Why: at concurrency 1 a step's one message through Serve's streaming generator costs the replica's
event loop about half a millisecond of Python (Serve's and Ray core's per-item plumbing, a thread-pool
hop per item), which holds the interpreter lock the engine thread needs, so the served engine step
stretches. Over a socket the same message is one `transport.write` on the replica and one
`data_received` on the ingress.

What stays with Serve: the request's own call (placement by the router, its first event, so time to
first token is unchanged; cancelling it aborts the request; Serve counts it as running until it ends).
Only the events after the first, for every stream of one ingress on one replica, travel here.

- `MuxServer` (replica): listens on the node's IP, on a port of the system's choosing, started with
  the first muxed request. Its `address` (host, port, token) goes to the ingress with each first event.
  A connection's hello must name this replica and carry the token, or it is refused (a stale address
  reused by another process, a stray client); the token is random per server, so only an ingress that
  received a first event from this replica can read its streams.
- `receive` (ingress): one connection, its frames handed to the demultiplexer as they arrive (in the
  protocol's `data_received`, no task per message); returns when the replica ends the subscription,
  raises when it was refused or broke.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import secrets
from collections.abc import Callable

from deployments import mux_frames, stream_mux
from dspark.errors import EngineDeadError

log = logging.getLogger(__name__)
HELLO_TIMEOUT_S = 10.0  # a connection that does not say who it is within this is dropped
WRITE_BUFFER_HIGH = 1 << 20  # bytes queued for a slow ingress before the subscription waits for it
# An idle subscription stays open this long after its last stream: back-to-back requests (concurrency 1)
# reuse it instead of connecting once each, and their first events can travel on it
# (deployments/stream_mux.py). No Serve call is held meanwhile, so nothing waits on it to drain.
LINGER_S = 2.0


class StreamLostError(EngineDeadError):
    """The connection carrying a replica's streams broke or was refused: those streams end (503)."""


class MuxServer:
    """A replica's listening socket for its ingress channels' subscriptions (one event loop)."""

    def __init__(self, outboxes: stream_mux.Outboxes, replica_id: str, host: str) -> None:
        self._outboxes = outboxes
        self._replica_id = replica_id
        self._host = host
        self._token = secrets.token_hex(16)
        self._server: asyncio.Server | None = None
        self._starting: asyncio.Task | None = None
        self.address: tuple[str, int, str] | None = None  # (host, port, token) once listening

    async def start(self) -> tuple[str, int, str]:
        """Listen (once; concurrent callers share the start) and return the address to hand out."""
        if self.address is not None:
            return self.address
        if self._starting is None:
            self._starting = asyncio.get_running_loop().create_task(self._listen())
        starting = self._starting
        try:
            await asyncio.shield(starting)
        except Exception:
            if self._starting is starting:  # the next muxed request tries again
                self._starting = None
            raise
        return self.address

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._serve, self._host, 0)
        port = self._server.sockets[0].getsockname()[1]
        self.address = (self._host, port, self._token)
        log.info("multiplexed streams served on %s:%d", self._host, port)

    def close(self) -> None:
        if self._server is not None:
            self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                (length,) = mux_frames.HEADER.unpack(
                    await asyncio.wait_for(reader.readexactly(mux_frames.HEADER.size), HELLO_TIMEOUT_S)
                )
                if length > 4096:
                    raise mux_frames.FrameError(f"hello of {length} bytes")
                payload = await asyncio.wait_for(reader.readexactly(length), HELLO_TIMEOUT_S)
                channel, replica_id, token = mux_frames.read_hello(payload)
            except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError, mux_frames.FrameError) as exc:
                log.warning("dropped a stream connection that sent no valid hello: %r", exc)
                return
            if replica_id != self._replica_id or not hmac.compare_digest(token, self._token):
                reason = f"this is replica {self._replica_id}, not {replica_id}, or the token is stale"
                writer.write(mux_frames.frame(mux_frames.REFUSED + reason.encode()))
                return
            await self._send(channel, writer)
        finally:
            writer.close()

    async def _send(self, channel: str, writer: asyncio.StreamWriter) -> None:
        transport = writer.transport
        async with contextlib.aclosing(self._outboxes.subscribe(channel, LINGER_S)) as messages:
            async for message in messages:
                if transport.is_closing():  # the ingress went away; its streams end with their requests
                    return
                transport.writelines((mux_frames.data_frame_header(message), message))
                if transport.get_write_buffer_size() > WRITE_BUFFER_HIGH:
                    await writer.drain()
        writer.write(mux_frames.frame(mux_frames.END))


class _Receiver(asyncio.Protocol):
    def __init__(self, deliver: Callable[[bytes], None], done: asyncio.Future) -> None:
        self._deliver = deliver
        self._done = done
        self._frames = mux_frames.FrameReader()

    def data_received(self, data: bytes) -> None:
        try:
            frames = self._frames.feed(data)
        except mux_frames.FrameError as exc:
            self._finish(StreamLostError(f"corrupt stream: {exc}"))
            return
        for payload in frames:
            kind = payload[:1]
            if kind == mux_frames.DATA:
                self._deliver(payload[1:])
            elif kind == mux_frames.END:
                self._finish(None)
            else:
                self._finish(StreamLostError(f"refused: {payload[1:].decode(errors='replace')}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self._finish(StreamLostError(f"connection closed before the streams ended ({exc!r})"))

    def _finish(self, error: BaseException | None) -> None:
        if self._done.done():
            return
        if error is None:
            self._done.set_result(None)
        else:
            self._done.set_exception(error)


async def receive(
    address: tuple[str, int, str], channel: str, replica_id: str, deliver: Callable[[bytes], None]
) -> None:
    """Subscribe `channel` at the replica `replica_id` listening at `address`, handing each message to
    `deliver`, until the replica ends the subscription; StreamLostError if it broke or was refused."""
    host, port, token = address
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    try:
        transport, _ = await loop.create_connection(lambda: _Receiver(deliver, done), host, port)
    except OSError as exc:
        raise StreamLostError(f"cannot reach replica {replica_id} at {host}:{port}: {exc!r}") from exc
    try:
        transport.write(mux_frames.hello(channel, replica_id, token))
        await done
    finally:
        transport.close()
