"""OpenAI response bodies and SSE chunks, built from replica events (pure; no Ray, no I/O).

Each final body and last chunk also carries `dspark`: the request's speculation stats, which the
official client keeps as an extra field, and from a target replica `timing`: when the request reached the
replica, when the engine admitted it, ran its first prompt chunk and produced its first token, in
time.monotonic() seconds of the replica's host (differences are durations anywhere; a client on the
same host can set them beside its own clock, e.g. bench/ttft_split.py), and `replica`: the id of the
replica that ran it.
"""

from __future__ import annotations

import json
from dataclasses import replace

from deployments.events import TIMING, StreamEvent


def sse(data: dict | str) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()


SSE_DONE = sse("[DONE]")


def _extras(last: StreamEvent) -> dict:
    extras = {"speculation": last.speculation.to_dict()}
    if last.timing is not None:  # a target replica's: when the engine took the request and answered it
        extras["timing"] = dict(zip(TIMING, last.timing))
    if last.replica is not None:  # ... and which replica that was
        extras["replica"] = last.replica
    return {"dspark": extras}


def completion_body(rid: str, model: str, created: int, text: str, last: StreamEvent) -> dict:
    return {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": last.finish_reason}],
        "usage": last.usage(),
        **_extras(last),
    }


def completion_chunk(rid: str, model: str, created: int, event: StreamEvent) -> dict:
    chunk = {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "text": event.text, "logprobs": None, "finish_reason": event.finish_reason}],
    }
    if event.finished:
        chunk.update(_extras(event))
    return chunk


def chat_body(rid: str, model: str, created: int, text: str, last: StreamEvent) -> dict:
    return {
        "id": rid,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": last.finish_reason,
            }
        ],
        "usage": last.usage(),
        **_extras(last),
    }


def chat_chunk(rid: str, model: str, created: int, event: StreamEvent, first: bool) -> dict:
    delta: dict = {"content": event.text}
    if first:
        delta["role"] = "assistant"
    chunk = {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": event.finish_reason}],
    }
    if event.finished:
        chunk.update(_extras(event))
    return chunk


class TextChunks:
    """The SSE bytes of one stream's chunks that carry text alone (every chunk but the first of a chat
    and the last): the stream's fixed JSON around the JSON of the text, so a token costs one
    `json.dumps` of a str instead of building and encoding a nested dict. Byte for byte what
    `sse(completion_chunk(...))` / `sse(chat_chunk(..., first=False))` give."""

    _MARK = "\x00dspark-text\x00"

    def __init__(self, rid: str, model: str, created: int, chat: bool) -> None:
        self._build = (
            (lambda e: chat_chunk(rid, model, created, e, first=False))
            if chat
            else (lambda e: completion_chunk(rid, model, created, e))
        )
        frame = sse(self._build(_text_only(self._MARK)))
        mark = json.dumps(self._MARK).encode()
        # A request id or model name that holds the mark itself leaves the frame ambiguous: build each.
        self._frame = frame.split(mark) if frame.count(mark) == 1 else None

    def __call__(self, event: StreamEvent) -> bytes:
        if self._frame is None or event.finished or event.finish_reason is not None:
            return sse(self._build(event))
        head, tail = self._frame
        return head + json.dumps(event.text).encode() + tail


def _text_only(text: str) -> StreamEvent:
    return replace(StreamEvent.before_any("", 0), text=text)


def usage_chunk(rid: str, model: str, created: int, last: StreamEvent, chat: bool) -> dict:
    """The extra last chunk of `stream_options: {include_usage: true}`: no choices, just usage."""
    return {
        "id": rid,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": created,
        "model": model,
        "choices": [],
        "usage": last.usage(),
    }


def models_body(model: str, created: int) -> dict:
    return {
        "object": "list",
        "data": [{"id": model, "object": "model", "created": created, "owned_by": "dspark"}],
    }
