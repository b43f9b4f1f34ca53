"""The prefill a step may carry: its token budget chosen from a step-time limit (pure, no torch).

Continuous batching puts prompt chunks beside the decoding requests in one forward, so every decoding
request waits for the chunks: a full 2048-token step can take several times an interactive request's
time per output token. Sarathi-Serve's answer is to choose the chunked-prefill token budget from the
latency target (vLLM's max_num_batched_tokens and SGLang's chunked_prefill_size are the static form of
it); here the limit is a step time, `DraftBudget.max_step_s`, which the cluster controller derives
from the SLA classes running on the replica, and the tokens follow from the replica's own cost table:
the most prefill tokens whose step, with the decoding requests' verified tokens, the table predicts
within the limit.

Two bounds keep it safe: never above the engine's `max_num_batched_tokens` (what is left of it after
the decoding tokens), and never below `floor` tokens while any room is left, so a prompt always makes
progress (no starvation when the decoding tokens alone already take the whole limit).
"""

from __future__ import annotations

from collections.abc import Callable


def prefill_tokens(
    sps: Callable[[int], float],
    decode_tokens: int,
    max_step_s: float | None,
    max_batched_tokens: int,
    floor: int,
) -> int:
    """The largest number of prefill tokens a step of `decode_tokens` verified tokens may add.

    `sps(B)`: steps per second of a forward over B tokens (dspark.cost_table.CostTable), non-increasing
    in B (the table is isotonic), so the predicted step time 1 / sps(B) is non-decreasing and the
    largest B within the limit is found by bisection. `max_step_s` None: no limit beyond the engine's;
    a step with no decoding requests (`decode_tokens` 0) delays no output token and takes the whole room.
    """
    room = max(0, max_batched_tokens - decode_tokens)
    if max_step_s is None or room == 0 or decode_tokens == 0:
        return room  # a step without decoding requests delays nobody's next token
    least = min(max(floor, 0), room)
    if 1.0 / sps(decode_tokens + room) <= max_step_s:
        return room
    lo, hi = 0, room  # 1 / sps(decode + lo) is within the limit or lo == 0; decode + hi is past it
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if 1.0 / sps(decode_tokens + mid) <= max_step_s:
            lo = mid
        else:
            hi = mid
    return max(lo, least)
