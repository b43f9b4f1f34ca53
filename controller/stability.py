"""Keeping the controller from chasing noise: the dead band, confirmation and the rate limit (pure).

Caps are compared in the units the engine feels. A step cap of `None` (no limit) is the most the
batch could verify, R·γ (a numeric cap above that is not the same: it binds once load rises); a
request or class cap of `None` is the window γ.

- Dead band: two caps are the same when no field differs by more than it may.
- Confirmation: a move goes only as far as the last windows *all* ask for. Field by field, when
  every window's target lies beyond the caps in force on the same side, the agreed value is the one
  nearest to the caps in force; when one window asks for the other side, or for nothing, that field
  stays. A single noisy window therefore moves nothing, a clean step is confirmed by the second
  window, and on a ramp the caps follow one window behind instead of waiting for the load to stop.
- Rate limit: a cap moves by at most half its range per period (the step cap by R·γ/2, a request or
  class cap by γ/2), so any agreed target is reached in two moves: a load step settles within three
  periods (one to confirm, two to move), and a target the next windows revise is never overshot by
  more than one move.

Flags (drafting, interactive priority) move at once once confirmed: they are either right or wrong.
So does the step-time limit (`max_step_s`): it follows from the SLA targets of the classes running
there, not from a load estimate, and its dead band is the step caps' fraction.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from controller.decision import Caps


@dataclass(frozen=True)
class Limits:
    dead_band_frac: float = 0.1  # step caps within 10 % (or `dead_band_tokens`) are the same
    dead_band_tokens: int = 2
    max_move_frac: float = 0.5  # a cap moves by at most this fraction of its range per period

    def __post_init__(self) -> None:
        if not 0.5 <= self.max_move_frac <= 1.0:
            # Below a half, a step from one end of the range to the other takes more than two moves.
            raise ValueError("max_move_frac must be within 0.5-1 (two moves reach any target)")


def _step(cap: int | None, most: int) -> int:
    return most if cap is None else cap  # not clamped: a cap above today's load still binds tomorrow


def _req(cap: int | None, window: int) -> int:
    return window if cap is None else min(cap, window)


def within_dead_band(a: Caps, b: Caps, most: int, window: int, limits: Limits) -> bool:
    if (a.drafting, a.interactive_priority) != (b.drafting, b.interactive_priority):
        return False
    sa, sb = _step(a.max_step_tokens, most), _step(b.max_step_tokens, most)
    if abs(sa - sb) > max(limits.dead_band_tokens, limits.dead_band_frac * max(sa, sb)):
        return False
    if _req(a.max_request_tokens, window) != _req(b.max_request_tokens, window):
        return False
    ta, tb = a.max_step_s, b.max_step_s
    if (ta is None) != (tb is None) or (
        ta is not None and abs(ta - tb) > limits.dead_band_frac * max(ta, tb)
    ):
        return False
    classes = set(a.by_class) | set(b.by_class)
    return all(_req(a.by_class.get(c), window) == _req(b.by_class.get(c), window) for c in classes)


def _nearest_agreed(current, targets: Sequence, units) -> object:
    """The target value nearest `current` when every target lies on one side of it, else `current`
    (values in their own encoding, compared in the engine's `units`; targets the same as `current` in
    those units keep the latest target's encoding, a number for `None` or the reverse)."""
    here = units(current)
    deltas = [units(t) - here for t in targets]
    if all(d > 0 for d in deltas) or all(d < 0 for d in deltas):
        return targets[min(range(len(targets)), key=lambda i: abs(deltas[i]))]
    return targets[-1] if not any(deltas) else current


def agreed(current: Caps, targets: Sequence[Caps], most: int, window: int) -> Caps:
    """What the last windows' targets (oldest first) all ask of `current`, field by field."""

    def flag(name: str) -> bool:
        values = {getattr(t, name) for t in targets}
        return values.pop() if len(values) == 1 else getattr(current, name)

    def req(c: int | None, ts: list) -> int | None:
        return _nearest_agreed(c, ts, lambda v: _req(v, window))

    steps = [t.max_step_tokens for t in targets]
    step = _nearest_agreed(current.max_step_tokens, steps, lambda v: _step(v, most))
    request = req(current.max_request_tokens, [t.max_request_tokens for t in targets])
    by_class = {}
    for name in sorted(set(current.by_class).union(*(t.by_class for t in targets))):
        value = req(current.by_class.get(name), [t.by_class.get(name) for t in targets])
        if value is not None:
            by_class[name] = value
    no_limit = 1e9  # seconds: longer than any step, so `None` compares as the loosest limit
    step_s = _nearest_agreed(
        current.max_step_s, [t.max_step_s for t in targets], lambda v: no_limit if v is None else v
    )
    return Caps(step, request, by_class, flag("drafting"), flag("interactive_priority"), step_s)


def toward(current: Caps, target: Caps, most: int, window: int, limits: Limits) -> tuple[Caps, bool]:
    """One period's move from `current` to `target`; True when the rate limit cut it short."""
    cur, tgt = _step(current.max_step_tokens, most), _step(target.max_step_tokens, most)
    step_move = max(1, math.ceil(limits.max_move_frac * most))
    if target.max_step_tokens is None and cur >= most:
        step = tgt  # the cap does not bind at this load: lifting it changes nothing now
    else:
        step = cur + max(-step_move, min(step_move, tgt - cur))
    limited = step != tgt
    step_cap = None if target.max_step_tokens is None and not limited else step
    req_move = max(1, math.ceil(limits.max_move_frac * window))

    def move(c: int | None, t: int | None) -> int | None:
        nonlocal limited
        a, b = _req(c, window), _req(t, window)
        d = max(-req_move, min(req_move, b - a))
        limited |= a + d != b
        return None if a + d >= window and t is None else a + d

    request_cap = move(current.max_request_tokens, target.max_request_tokens)
    by_class = {}
    for name in set(current.by_class) | set(target.by_class):
        moved = move(current.by_class.get(name), target.by_class.get(name))
        if moved is not None:
            by_class[name] = moved
    caps = Caps(
        step_cap, request_cap, by_class, target.drafting, target.interactive_priority, target.max_step_s
    )
    return caps, limited
