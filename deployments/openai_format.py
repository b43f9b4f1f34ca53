"""OpenAI response bodies and SSE chunks, built from replica events (pure; no Ray, no I/O).

Each final body and last chunk also carries `dspark`: the request's speculation stats, which the
official client keeps as an extra field.
"""

from __future__ import annotations

import json

from deployments.events import StreamEvent


def sse(data: dict | str) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()


SSE_DONE = sse("[DONE]")


def _extras(last: StreamEvent) -> dict:
    return {"dspark": {"speculation": last.speculation.to_dict()}}


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
