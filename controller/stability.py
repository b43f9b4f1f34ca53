"""Keeping the controller from chasing noise: the dead band and the rate limit on caps (pure).

Caps are compared in the units the engine feels. A step cap of `None` (no limit) is the most the
batch could verify, R·γ (a numeric cap above that is not the same: it binds once load rises); a
request or class cap of `None` is the window γ. Two caps are within the
dead band when no field differs by more than it may; a move toward a new target changes a step cap
by at most a factor, a request or class cap by at most a few tokens, per period. Flags (drafting,
interactive priority) move at once: they are either right or wrong.
"""

from __future__ import annotations

from dataclasses import dataclass

from controller.decision import Caps


@dataclass(frozen=True)
class Limits:
    dead_band_frac: float = 0.1  # step caps within 10 % (or `dead_band_tokens`) are the same
    dead_band_tokens: int = 2
    max_step_factor: float = 4.0  # a step cap moves by at most ×4 or ÷4 per period
    max_request_delta: int = 4  # request and class caps move by at most this many tokens per period


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
    classes = set(a.by_class) | set(b.by_class)
    return all(_req(a.by_class.get(c), window) == _req(b.by_class.get(c), window) for c in classes)


def toward(current: Caps, target: Caps, most: int, window: int, limits: Limits) -> tuple[Caps, bool]:
    """One period's move from `current` to `target`; True when the rate limit cut it short."""
    cur, tgt = _step(current.max_step_tokens, most), _step(target.max_step_tokens, most)
    if target.max_step_tokens is None and cur >= most:
        step = tgt  # the cap does not bind at this load: lifting it changes nothing now
    elif tgt < cur:
        step = max(tgt, int(cur / limits.max_step_factor))
    else:  # from 0 (the model said drafting does not pay) growth must still get going
        step = min(tgt, max(int(cur * limits.max_step_factor), cur + limits.dead_band_tokens + 1))
    limited = step != tgt
    step_cap = None if target.max_step_tokens is None and not limited else step

    def move(c: int | None, t: int | None) -> int | None:
        nonlocal limited
        a, b = _req(c, window), _req(t, window)
        d = max(-limits.max_request_delta, min(limits.max_request_delta, b - a))
        limited |= a + d != b
        return None if a + d >= window and t is None else a + d

    request_cap = move(current.max_request_tokens, target.max_request_tokens)
    by_class = {}
    for name in set(current.by_class) | set(target.by_class):
        moved = move(current.by_class.get(name), target.by_class.get(name))
        if moved is not None:
            by_class[name] = moved
    caps = Caps(step_cap, request_cap, by_class, target.drafting, target.interactive_priority)
    return caps, limited
