"""Whether to draft at all this round: the drafter's own cost against what drafting is expected to gain.

Algorithm 1 weighs only the target's verify cost, which is right for choosing verify lengths: once a
block is drafted its cost is sunk. But where drafting is a large share of a step (a CPU, a small
target) the block can cost more than its accepted tokens save, at any verify length; the paper names
this as the method's open limitation (docs/ALGORITHM.md §10). The gate decides before drafting, from
earlier rounds only, so the decision cannot depend on the tokens it is about (as with the pipelined
variant's capacity) and verification stays lossless. With R decoding requests it drafts when

    R (1 + g) / (1/SPS(R + v R) + d R)  >  R SPS(R)

where, per request and drafting round, g is the accepted drafted tokens, v the verified drafted tokens
and d the drafting seconds (exponential averages of what the engine measured). While it declines it
still drafts once in a while (a probe), so lighter load or a better drafter is noticed; each probe that
confirms the decline doubles the wait before the next one (up to `max_probe_every`), so a drafter that
never pays costs ever less.

A drafter folds the target's hidden states into its own context only when it next drafts, so the first
round after declined rounds (and the gate's very first, which folds the prompt) also pays for the
rounds that did not draft: on this project's CPU a probe after 16 declined rounds took ~10-14 ms against
~6.6 ms for a steady round, enough to confirm every decline by itself. Such a round's gains count, its
time does not: the gate drafts the round after it too, and times that one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class DraftGate:
    ema: float = 0.2
    probe_every: int = 16  # rounds declined before the next probe; doubles while probes confirm
    min_probe_every: int = 16
    max_probe_every: int = 256
    gain: float | None = None  # accepted drafted tokens per request-round
    verified: float = 0.0  # verified drafted tokens per request-round
    draft_s: float | None = None  # drafting seconds per request, of rounds that folded no backlog
    declined: int = 0  # rounds in a row without drafting
    timing: bool = False  # the last round folded a backlog: draft this one too and time it
    probing: bool = False  # ... and that round was a probe: this one confirms or ends the decline

    def should_draft(self, num_requests: int, sps: Callable[[int], float]) -> bool:
        if self.draft_s is None or self.timing or num_requests == 0 or self.declined >= self.probe_every:
            return True  # nothing measured yet, a steady round to time, or time to re-probe
        return self.pays(num_requests, sps)

    def pays(self, num_requests: int, sps: Callable[[int], float]) -> bool:
        """Does drafting beat plain decoding for `num_requests`, by what earlier rounds measured?"""
        r = num_requests
        plain_rate = r * sps(r)
        step_s = 1.0 / sps(r + round(self.verified * r)) + self.draft_s * r
        return r * (1.0 + self.gain) / step_s > plain_rate

    def record(
        self,
        drafted: bool,
        num_requests: int,
        accepted: int,
        verified: int,
        draft_seconds: float,
        sps: Callable[[int], float] | None = None,
    ) -> None:
        """What one round did: totals over its `num_requests` decoding requests."""
        if not drafted:
            self.declined += 1
            return
        backlog = self.gain is None or self.declined > 0  # it folded earlier rounds' context too
        was_probe = self.probing
        self.probing = self.declined >= self.probe_every
        self.timing = backlog
        self.declined = 0
        if num_requests == 0:
            return
        a = self.ema
        gain, verified_each = accepted / num_requests, verified / num_requests
        if self.gain is None:
            self.gain, self.verified = gain, verified_each
        else:
            self.gain = (1 - a) * self.gain + a * gain
            self.verified = (1 - a) * self.verified + a * verified_each
        if backlog:
            return
        draft_s = draft_seconds / num_requests
        self.draft_s = draft_s if self.draft_s is None else (1 - a) * self.draft_s + a * draft_s
        if sps is None:
            return
        if self.pays(num_requests, sps):
            self.probe_every = self.min_probe_every
        elif was_probe:  # the probe confirmed the decline: wait longer before the next one
            self.probe_every = min(2 * self.probe_every, self.max_probe_every)

    def to_dict(self) -> dict:
        """Its state: accepted and verified drafts per request-round and drafting seconds per request (as
        measured, smoothed), rounds declined in a row, and the rounds it declines before the next probe."""
        return {
            "gain": self.gain,
            "verified": self.verified,
            "draft_s": self.draft_s,
            "declined": self.declined,
            "probe_every": self.probe_every,
        }
