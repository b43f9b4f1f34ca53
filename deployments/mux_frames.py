"""The wire of the multiplexed streams' direct connection (deployments/mux_socket.py): length-prefixed
frames on a TCP stream, pure (no I/O), so both ends and their tests share one definition.

A frame is a 4-byte big-endian length, then that many bytes. The ingress opens with one HELLO frame
(msgpack of [channel, replica id, token]: which ingress it is, which replica it meant to reach, and the
token that replica handed out with a request's first event). The replica answers with frames whose
first byte says what follows:
- DATA: one subscription message (stream_mux.Outbox.batches: a step's events of this ingress' streams);
- END: the subscription ended because none of this ingress' streams runs here (the connection closes;
  a stream placed meanwhile needs a new one);
- REFUSED: the hello named another replica or a wrong token (a stale address); a reason follows.
A connection that closes without END or REFUSED broke: the replica, or the network, went away.
"""

from __future__ import annotations

import struct

import msgpack

HEADER = struct.Struct("!I")
MAX_FRAME = 1 << 30  # a longer length means a corrupt stream, not a message
DATA, END, REFUSED = b"D", b"E", b"R"


class FrameError(ValueError):
    """The bytes on the connection are not frames of this wire."""


def frame(payload: bytes) -> bytes:
    return HEADER.pack(len(payload)) + payload


def data_frame_header(message: bytes) -> bytes:
    """The bytes before a DATA frame's message (written separately, so the message is not copied)."""
    return HEADER.pack(len(message) + 1) + DATA


def hello(channel: str, replica_id: str, token: str) -> bytes:
    return frame(msgpack.packb([channel, replica_id, token]))


def read_hello(payload: bytes) -> tuple[str, str, str]:
    try:
        channel, replica_id, token = msgpack.unpackb(payload)
    except Exception as exc:
        raise FrameError(f"not a hello: {exc!r}") from None
    if not all(isinstance(x, str) for x in (channel, replica_id, token)):
        raise FrameError("not a hello: its fields must be strings")
    return channel, replica_id, token


class FrameReader:
    """Cuts the bytes received so far into whole frames; a partial frame waits for the rest."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        buffer = self._buffer
        buffer += data
        frames, start = [], 0
        while len(buffer) - start >= HEADER.size:
            (length,) = HEADER.unpack_from(buffer, start)
            if length > MAX_FRAME:
                raise FrameError(f"frame of {length} bytes")
            end = start + HEADER.size + length
            if end > len(buffer):
                break
            frames.append(bytes(buffer[start + HEADER.size : end]))
            start = end
        del buffer[:start]
        return frames

    @property
    def pending(self) -> int:
        """Bytes of an incomplete frame held."""
        return len(self._buffer)
