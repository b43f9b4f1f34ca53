"""SSE chunks of text alone, built from the stream's fixed frame, are byte for byte the general path's."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from deployments import openai_format as fmt
from deployments.events import StreamEvent
from dspark.outputs import SpeculationStats

TEXTS = ["", " hello", 'say "hi"\n\tthen \\ leave', "é中文🙂", "\x00\x1f", "</script>", "\ud800"]


def event(text: str, finished: bool = False) -> StreamEvent:
    reason = "length" if finished else None
    return StreamEvent("r", text, (1,), finished, reason, 3, 4, SpeculationStats(2, 4, 1, 1.5))


@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize("rid", ["cmpl-1f2e", 'odd "id" \x00dspark-text\x00'])
def test_text_chunks_equal_the_general_chunks(chat, rid):
    chunks = fmt.TextChunks(rid, "target", 1_700_000_000, chat)

    def general(e: StreamEvent) -> bytes:
        if chat:
            return fmt.sse(fmt.chat_chunk(rid, "target", 1_700_000_000, e, first=False))
        return fmt.sse(fmt.completion_chunk(rid, "target", 1_700_000_000, e))

    for text in TEXTS:
        for finished in (False, True):
            e = event(text, finished)
            assert chunks(e) == general(e)
    # The bytes parse as the chunk they stand for (the SSE framing around one JSON object).
    parsed = json.loads(chunks(event("é\n")).removeprefix(b"data: ").removesuffix(b"\n\n"))
    choice = parsed["choices"][0]
    assert (choice["delta"]["content"] if chat else choice["text"]) == "é\n"
    assert parsed["id"] == rid and choice["finish_reason"] is None


@pytest.mark.parametrize("chat", [False, True])
def test_the_last_chunk_names_the_replicas_timing(chat):
    """A target replica's last event carries its timing: the last chunk and body name each stamp (the
    official client keeps them under model_extra["dspark"]) and the replica; a stream without them
    (SGLang's) has neither."""
    stamps = (10.0, 10.25, 10.5, 11.0)
    last = replace(event("", finished=True), timing=stamps, replica="3xk9p2")

    def chunk(e: StreamEvent) -> dict:
        if chat:
            return fmt.chat_chunk("r", "target", 0, e, first=False)
        return fmt.completion_chunk("r", "target", 0, e)

    named = dict(zip(("received", "admitted", "scheduled", "first_token"), stamps))
    assert chunk(last)["dspark"]["timing"] == named
    body = fmt.chat_body if chat else fmt.completion_body
    assert body("r", "target", 0, "", last)["dspark"]["timing"] == named
    assert chunk(last)["dspark"]["replica"] == "3xk9p2"
    assert body("r", "target", 0, "", last)["dspark"]["replica"] == "3xk9p2"
    assert not {"timing", "replica"} & set(chunk(event("", finished=True))["dspark"])
    assert "dspark" not in chunk(replace(event("a"), timing=stamps))
    parsed = json.loads(fmt.TextChunks("r", "target", 0, chat)(last).removeprefix(b"data: "))
    assert parsed["dspark"]["timing"] == named
