"""A real request's time to first token in parts, from the replica's `timing` (pure; no Ray, no I/O).

A target replica's last chunk carries `dspark.timing` (deployments/openai_format.py): when the request
reached the replica (`received`), when the engine admitted it, ran its first prompt chunk (`scheduled`)
and produced its first token, in time.monotonic() seconds of the replica's host. Of a request's TTFT at
the client, the engine's part is then its queue (received to scheduled: the wait for the step in flight,
admission, the steps before its first) and its prefill (scheduled to the first token: the forward of its
last prompt chunk and the chunks before it); the rest is the serving path, both ways (client, proxy,
ingress and the replica's handling to the replica, then the first token's way back). The simulator's
requests split the same way (sim.workload.Request.ttft_parts), so both can be set side by side.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # not imported: bench/serving_cost.py runs with bench/ first on sys.path (bench/sim.py)
    from sim.workload import Request


def timing_of(chunk) -> dict | None:
    """The replica's `timing` if `chunk` (an `openai` client's completion chunk) is a stream's finishing
    one, which carries it (deployments/openai_format.py); None for any other chunk."""
    return _finishing_extras(chunk).get("timing")


def replica_of(chunk) -> str | None:
    """The replica that ran the request, from a stream's finishing chunk (None for any other chunk)."""
    return _finishing_extras(chunk).get("replica")


def _finishing_extras(chunk) -> dict:
    """The `dspark` extras of a stream's finishing chunk; empty for any other chunk."""
    if not (chunk.choices and chunk.choices[0].finish_reason is not None):
        return {}
    return (chunk.model_extra or {}).get("dspark", {})


def engine_spans(timing: dict | None) -> tuple[float, float] | None:
    """(queue, prefill) seconds from a replica's `timing` (None when it lacks a stamp)."""
    if not timing:
        return None
    stamps = [timing.get(k) for k in ("received", "scheduled", "first_token")]
    if None in stamps:
        return None
    received, scheduled, first = stamps
    return scheduled - received, first - scheduled


def place(req: Request, timing: dict | None) -> None:
    """Put a real request's engine spans into its record as the simulator's are kept: `scheduled` its
    prefill before its first token (at the client), `admitted` its queue before that, so that
    Request.ttft_parts gives (path, queue, prefill) with the path both ways in the first. Leaves a
    request without a first token or a complete `timing` as it is."""
    spans = engine_spans(timing)
    if spans is None or req.first_token is None:
        return
    queue, prefill = spans
    req.scheduled = req.first_token - prefill
    req.admitted = req.scheduled - queue
