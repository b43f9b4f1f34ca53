"""How fast a replica decodes, as the SLA router models it (pure: no Ray, no I/O; router/policy.py
predicts and chooses with it).

The model of a replica (dspark/engine.py). Each engine step runs one target forward over B tokens: every
decoding request's anchor plus the l drafted tokens it verifies, then prefill chunks of admitted prompts
in whatever is left of the step's token budget M. A forward of B tokens runs at SPS(B) steps per second
(the replica's profiled cost table); drafting and the engine's own work stretch each step by the measured
factor `overhead` = step time / forward time. So a step of B tokens takes overhead / SPS(B) seconds.

Decode rate. Each round a decoding request gains tau(l) tokens: the accepted drafts plus the one token
the target always adds. With a per-position survival alpha (drafted token j survives with alpha^j, the
geometric law the drafter's acceptance follows on average), tau(l) = 1 + sum_{j<=l} alpha^j. A replica
with n decoding requests that verify l drafts each steps at SPS(n (1 + l)) / overhead, and every one of
its requests advances once per step, so

    rate per request = tau(l) * SPS(n (1 + l) + p) / overhead,        TPOT = 1 / rate,

where p is the prefill a step carries beside the decoding tokens (below; 0 on a replica no prompt reaches).

Calibration. What the table and the overhead leave out, the requests still wait for: the prefill chunks
in their steps (p above, when not predicted), the serving loop between steps, other replicas and threads
on the same cores. The replica measures the wall time its decoding requests waited per round and the
decode tokens of those steps; the ratio of that to the model's step at those tokens (`Speed.calibration`,
bounded, 1 when unmeasured or old: router/signals.py decode_calibration) scales the decode-only TPOT, so
a replica is predicted as it runs now: a slow or contended one as slow as it has been. The router applies
it with `PolicyConfig.calibrate_tpot` (router/policy.py; off by default: see there why).

(The replica's throughput is n times that: the "/batch" of aggregate throughput is the n inside SPS.)
The batch slows everyone twice: B grows with n, and the verify length l the replica can afford shrinks.
How l is chosen mirrors the engine: the DSpark scheduler picks the l that maximises the step's expected
tokens per second, n tau(l) SPS(n (1 + l)) (at fixed n: tau(l) SPS(n (1 + l))), within the draft
budget; a fixed window verifies its cap. Both are cut so n (1 + l) <= M and n l <= the step's draft cap.

Prefill in the decode steps. Chunked prefill puts the prompts' tokens into the same forwards as the
decoding requests (after them: M - n (1 + l) is what a step has left for prompts), so under load most
of a step's tokens may be prefill (on a GPU-class replica at 80% load, three quarters of them: a step
carrying a chunk takes ~73 ms against ~27 ms decode-only) and a per-token prediction from the decode
tokens alone is far too optimistic. Two sources of prefill reach a request's steps:
  the prompts that arrive while it decodes: at `prefill_rate` tokens per second (the replica's recent
  prompt inflow), a step of time T carries what arrived during it, p = rate * T(n (1 + l) + p), at most
  what the budget leaves (beyond that the queue grows and every step is full);
  the prompts queued now (and the newcomer's own): they run within the next steps, spread here over the
  residents' remaining rounds (the median of their tokens left / tau).
The newcomer's own TPOT sees only the first: the queue ahead of it is prefilled before its first token.
The residents see both, so the newcomer's prompt is part of its harm to them. This is
`PolicyConfig.prefill_aware` (router/policy.py), off by default: see there why.

"""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class SpsTable:
    """SPS(B): target forwards per second at B tokens, linear between profiled points, flat beyond."""

    points: tuple[int, ...]
    rates: tuple[float, ...]

    def __call__(self, tokens: float) -> float:
        points, rates = self.points, self.rates
        if tokens <= points[0]:
            return rates[0]
        k = bisect.bisect_right(points, tokens)
        if k == len(points):
            return rates[-1]
        b0, b1 = points[k - 1], points[k]
        return rates[k - 1] + (rates[k] - rates[k - 1]) * (tokens - b0) / (b1 - b0)


@dataclass(frozen=True)
class Speed:
    """How fast a replica steps: its cost table, its drafter's acceptance and its draft budget."""

    sps: SpsTable
    max_batch_tokens: int  # M, the step's token budget (max_num_batched_tokens)
    acceptance: float  # alpha in [0, 1): the per-position survival of a drafted token
    draft_cap: int  # the most drafts one request verifies per round (its window cut to the budget)
    step_draft_cap: int | None = None  # the most drafts one step verifies over the batch
    adaptive: bool = True  # DSpark scheduler (l maximises tau * SPS) or a fixed window (l = cap)
    overhead: float = 1.0  # step time / forward time: drafting and the engine's own work
    # A decode step's measured wall time over the model's (router/signals.py decode_calibration): what
    # the requests also wait for, that the model above leaves out (the prefill chunks in their steps,
    # the serving loop between steps, contention). Scales the decode-only TPOT (module docstring).
    calibration: float = 1.0
    class_caps: Mapping[str, int] = field(default_factory=dict)  # SLA class -> its own draft cap
    # verify_length and tpot are pure in (speed, batch, class): remembered per Speed, which the router
    # keeps for as long as the replica's stats do not change, so most decisions only look them up.
    _memo: dict = field(default_factory=dict, init=False, repr=False, compare=False)


# ---- speed ---------------------------------------------------------------------------------------


def tau(acceptance: float, length: float) -> float:
    """Expected tokens a round gains when `length` drafts are verified: 1 + sum_{j<=length} alpha^j."""
    if acceptance >= 1.0:
        return 1.0 + length
    return 1.0 + acceptance * (1.0 - acceptance**length) / (1.0 - acceptance)


def verify_length(speed: Speed, batch: int, sla_class: str | None = None) -> int:
    """The drafts each of `batch` decoding requests verifies per round, as the replica would choose."""
    if sla_class not in speed.class_caps:
        sla_class = None  # a class without a cap of its own verifies what every request does: one entry
    key = ("l", batch, sla_class)
    length = speed._memo.get(key)
    if length is None:
        length = speed._memo[key] = _verify_length(speed, batch, sla_class)
    return length


def _verify_length(speed: Speed, batch: int, sla_class: str | None) -> int:
    cap = speed.draft_cap if sla_class is None else speed.class_caps.get(sla_class, speed.draft_cap)
    room = speed.max_batch_tokens - batch  # drafted tokens the step budget leaves after the anchors
    if speed.step_draft_cap is not None:
        room = min(room, speed.step_draft_cap)
    cap = max(0, min(cap, room // max(batch, 1)))
    if not speed.adaptive or cap == 0:
        return cap
    sps, alpha = speed.sps, speed.acceptance
    # The first length with the most tokens per second (max() over range(cap + 1) by that key, unrolled:
    # this runs for every new stats version of every candidate).
    best, best_rate = 0, tau(alpha, 0) * sps(batch)
    for n in range(1, cap + 1):
        rate = tau(alpha, n) * sps(batch * (1 + n))
        if rate > best_rate:
            best, best_rate = n, rate
    return best


def step_time(speed: Speed, tokens: float) -> float:
    return speed.overhead / speed.sps(tokens)


def decode_round(speed: Speed, batch: int, sla_class: str | None = None) -> tuple[int, float]:
    """(decode tokens of a step with `batch` decoding requests, tokens one of them of `sla_class` gains
    per round): the anchors and drafts every request verifies, and tau at its own (maybe capped) length."""
    if sla_class not in speed.class_caps:
        sla_class = None  # uncapped: its own length is every request's
    key = ("round", batch, sla_class)
    found = speed._memo.get(key)
    if found is None:
        batch_ = max(batch, 1)
        length = verify_length(speed, batch_)
        own = length if sla_class is None else min(length, verify_length(speed, batch_, sla_class))
        found = speed._memo[key] = (batch_ * (1 + length), tau(speed.acceptance, own))
    return found


def prefill_per_step(speed: Speed, batch: int, rate: float) -> float:
    """Prefill tokens a step of `batch` decoding requests carries when prompts arrive at `rate` tokens per
    second: the fixed point p = rate * step_time(D + p), at most the M - D tokens the decode D leaves."""
    if rate <= 0:
        return 0.0
    key = ("prefill", batch, rate)
    if key not in speed._memo:
        decode, _ = decode_round(speed, batch)
        room = max(0, speed.max_batch_tokens - decode)
        if rate * step_time(speed, decode + room) >= room:
            speed._memo[key] = float(room)  # the inflow fills every step: the budget binds
        else:
            # rate * T(D + p) - p is > 0 at p = 0 and < 0 at p = room: bisect to a root (to ~room / 4096).
            lo, hi = 0.0, float(room)
            for _ in range(12):
                mid = (lo + hi) / 2
                lo, hi = (mid, hi) if rate * step_time(speed, decode + mid) > mid else (lo, mid)
            speed._memo[key] = hi
    return speed._memo[key]


def tpot(speed: Speed, batch: int, sla_class: str | None = None, prefill: float = 0.0) -> float:
    """Seconds per output token of a request decoding among `batch` requests, its steps carrying
    `prefill` prompt tokens each on average (see the module docstring)."""
    if prefill <= 0:
        key = ("tpot", batch, sla_class if sla_class in speed.class_caps else None)
        seconds = speed._memo.get(key)
        if seconds is None:
            decode, gain = decode_round(speed, batch, sla_class)
            seconds = speed._memo[key] = speed.calibration * step_time(speed, decode) / gain
        return seconds
    # Not calibrated: the prefill is predicted here, and the calibration, measured against decode tokens
    # alone, holds the recent prefill already (it would count twice).
    decode, gain = decode_round(speed, batch, sla_class)
    return step_time(speed, min(speed.max_batch_tokens, decode + prefill)) / gain
