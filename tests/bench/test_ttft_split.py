"""bench/ttft_split.py: a real request's TTFT at the client in parts from its replica's timing, kept as
the simulator keeps its requests' (Request.ttft_parts)."""

from __future__ import annotations

import pytest

from bench.ttft_split import engine_spans, place, timing_of
from sim.workload import Request

TIMING = {"received": 100.0, "admitted": 100.002, "scheduled": 100.01, "first_token": 100.04}


def test_the_engines_part_is_its_queue_from_receipt_and_its_prefill():
    queue, prefill = engine_spans(TIMING)
    assert queue == pytest.approx(0.01, abs=1e-9) and prefill == pytest.approx(0.03, abs=1e-9)
    assert engine_spans(None) is None and engine_spans({}) is None
    assert engine_spans({**TIMING, "scheduled": None}) is None  # ended before its first chunk ran


def test_a_placed_request_splits_its_client_ttft_into_path_queue_and_prefill():
    """Client TTFT 75 ms: 10 ms queue and 30 ms prefill at the engine leave 35 ms of serving path."""
    req = Request(0, 2.0, 48, 64, "standard", "code")
    req.first_token = 2.075
    place(req, TIMING)
    path, queue, prefill = req.ttft_parts
    assert (path, queue, prefill) == pytest.approx((0.035, 0.01, 0.03), abs=1e-9)
    assert sum(req.ttft_parts) == pytest.approx(req.ttft, abs=1e-12)
    untimed = Request(1, 2.0, 48, 64, "standard", "code")
    untimed.first_token = 2.075
    place(untimed, None)
    assert untimed.ttft_parts is None
    unstarted = Request(2, 2.0, 48, 64, "standard", "code")
    place(unstarted, TIMING)  # no first token at the client (shed): nothing to split
    assert unstarted.ttft_parts is None


def completion_chunk(finish_reason: str | None, extra: dict) -> object:
    """A streamed chunk as the `openai` client builds it (constructed, not validated: a chunk before the
    last has no finish_reason, which the model's own validation would refuse)."""
    from openai.types import Completion, CompletionChoice

    choice = CompletionChoice.model_construct(index=0, text="a", finish_reason=finish_reason, logprobs=None)
    body = {"id": "c", "object": "text_completion", "created": 0, "model": "m", "choices": [choice]}
    return Completion.model_construct(**body, **extra)


def test_the_timing_is_read_from_the_streams_finishing_chunk_only():
    extra = {"dspark": {"timing": TIMING}}
    assert timing_of(completion_chunk("length", extra)) == TIMING
    assert timing_of(completion_chunk(None, extra)) is None  # not the last chunk
    assert timing_of(completion_chunk("stop", {})) is None  # a server that sends none
