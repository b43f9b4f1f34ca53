"""The multiplexed streams' socket wire (deployments/mux_frames.py): frames cut from any split of the
bytes, in order; the hello's fields checked; a corrupt length refused."""

from __future__ import annotations

import msgpack
import pytest

from deployments.mux_frames import (
    DATA,
    END,
    MAX_FRAME,
    FrameError,
    FrameReader,
    data_frame_header,
    frame,
    hello,
    read_hello,
)


def test_frames_come_out_whole_and_in_order_however_the_bytes_arrive():
    payloads = [b"", DATA + b"x" * 300, END, b"\x00" * 5]
    wire = b"".join(frame(p) for p in payloads)
    for chunk in (1, 3, 7, len(wire)):
        reader = FrameReader()
        got = []
        for i in range(0, len(wire), chunk):
            got += reader.feed(wire[i : i + chunk])
        assert got == payloads, chunk
        assert reader.pending == 0
    reader = FrameReader()
    assert reader.feed(wire[:-2]) == payloads[:3]
    assert reader.pending == 4 + 5 - 2  # the last frame's header and three of its bytes wait


def test_a_data_frame_is_its_header_then_the_message_uncopied():
    message = msgpack.packb(["key", 0, b"event"])
    assert data_frame_header(message) + message == frame(DATA + message)


def test_hello_round_trip_and_what_is_no_hello():
    (payload,) = FrameReader().feed(hello("chan", "replica-1", "tok"))
    assert read_hello(payload) == ("chan", "replica-1", "tok")
    for bad in (b"\xc1", msgpack.packb(["chan", "replica-1"]), msgpack.packb(["chan", 1, "tok"])):
        with pytest.raises(FrameError, match="not a hello"):
            read_hello(bad)


def test_a_length_beyond_any_message_is_a_corrupt_stream():
    with pytest.raises(FrameError, match="frame of"):
        FrameReader().feed((MAX_FRAME + 1).to_bytes(4, "big"))
