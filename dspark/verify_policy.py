"""How many drafted tokens of each request the target verifies this round.

The engine hands a policy one `VerifyRound` per step: every decoding request's window (what it
proposed, cut to the draft budget), the prefix survival of those tokens when the drafter reports
confidences, the step's cap, the cost table, and the survival of the round two rounds back (the
pipelined variant's causal firewall). Policies are pure functions of it; the modes of
`EngineConfig.scheduler` map to them in `make_policy`.

Every policy here verifies, per request, a prefix whose length depends only on confidences of
slots up to it (see dspark/scheduler.py for why that is what keeps verification lossless).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from dspark.drafter import DraftProposal
from dspark.scheduler import (
    Sps,
    best_capacity,
    pick_top,
    schedule,
    schedule_groups,
    split_groups,
    survival,
    write_out,
)


@dataclass(frozen=True)
class VerifyRound:
    """One step's decoding requests as a policy sees them, in the engine's (arrival) order."""

    windows: list[int]  # drafted tokens each request may verify: its proposal cut to its budget
    survival: list[list[float] | None]  # a_{r,1..windows[r]}; None when the drafter gave no confidence
    step_cap: int  # the most drafted tokens verified this step, summed over requests
    sps: Sps | None = None  # the engine's cost table; None when it has none
    history: list[list[float]] | None = None  # survival two rounds back, None until there is one

    @staticmethod
    def build(
        proposals: list[DraftProposal],
        caps: list[int],
        step_cap: int,
        sps: Sps | None = None,
        history: list[list[float]] | None = None,
    ) -> VerifyRound:
        windows = [min(cap, len(p.token_ids)) for p, cap in zip(proposals, caps)]
        rows = [
            None if p.confidence is None else survival(p.confidence[:n].tolist())
            for p, n in zip(proposals, windows)
        ]
        return VerifyRound(windows, rows, step_cap, sps, history)


class VerifyLengthPolicy(Protocol):
    def choose(self, round_: VerifyRound) -> list[int]:
        """Verify lengths l_r <= windows[r] with sum(l_r) <= step_cap."""


def trim_longest(lengths: list[int], step_cap: int) -> list[int]:
    """Over the step cap: shorten the longest windows first (ties: the earlier request)."""
    lengths = list(lengths)
    spare = step_cap - sum(lengths)
    while spare < 0 and any(lengths):
        i = max(range(len(lengths)), key=lambda r: (lengths[r], -r))
        lengths[i] -= 1
        spare += 1
    return lengths


class FixedLength:
    """Verify every request's whole window (fixed gamma, MTP-1 and plain are windows of gamma, 1, 0)."""

    def choose(self, round_: VerifyRound) -> list[int]:
        return trim_longest(round_.windows, round_.step_cap)


class ConfidenceThreshold:
    """Static pruning: verify the drafted tokens whose prefix survival reaches `threshold`.

    Requests without confidences keep their whole window; over the step cap the lowest survivals go.
    """

    def __init__(self, threshold: float) -> None:
        self.threshold = threshold

    def choose(self, round_: VerifyRound) -> list[int]:
        fixed, rows, cap = _split(round_)
        cut = [[a for a in row if a >= self.threshold] for row in rows]
        return _merge(fixed, pick_top(cut, cap))


class ScheduledLength:
    """The DSpark scheduler: Algorithm 1 with the early stop, or its pipelined variant.

    Pipelined: the capacity K comes from the survival of two rounds earlier (no stop, so the search
    crosses SPS cliffs); live confidences only rank the top-K pick. Until two rounds exist it falls
    back to Algorithm 1. Requests without confidences keep their whole window and count in B; with
    no cost table (an engine started with nothing to draft) every window is verified in full.
    """

    def __init__(self, pipelined: bool = False) -> None:
        self.pipelined = pipelined

    def choose(self, round_: VerifyRound) -> list[int]:
        if round_.sps is None:
            return trim_longest(round_.windows, round_.step_cap)
        fixed, rows, cap = _split(round_)
        extra = sum(fixed)
        if self.pipelined and round_.history is not None:
            k = best_capacity(round_.history, len(rows), round_.sps, cap, extra)
            return _merge(fixed, pick_top(rows, k))
        # The early stop walks on the step time's convex envelope, where it finds the global optimum
        # (dspark/scheduler.py): a cost table offers it; any other SPS function is taken as it is.
        walk = getattr(round_.sps, "convex", round_.sps)
        return _merge(fixed, schedule(rows, walk, cap, extra))


def _split(round_: VerifyRound) -> tuple[list[int], list[list[float]], int]:
    """Windows of requests without confidences (trimmed to the cap), the others' survival rows, cap left."""
    fixed = trim_longest(
        [w if row is None else 0 for w, row in zip(round_.windows, round_.survival)], round_.step_cap
    )
    rows = [row or [] for row in round_.survival]
    return fixed, rows, round_.step_cap - sum(fixed)


def _merge(fixed: list[int], chosen: list[int]) -> list[int]:
    return [f + c for f, c in zip(fixed, chosen)]


def choose_groups(
    policy: VerifyLengthPolicy,
    windows: list[int],
    rows: list[list[float]],
    counts: list[int],
    step_cap: int,
    sps: Sps | None,
) -> list[list[int]]:
    """`policy.choose` on a round of requests in groups: `counts[g]` requests with window `windows[g]`
    and survival `rows[g]`, group after group, no history. Each group's members' lengths, in order, as
    choose() gives them on that round written out. The cluster simulator's requests of one domain and
    window share their rows: Algorithm 1 then walks each group's members at one position as a run
    (dspark.scheduler.schedule_groups); any other policy, or no table, takes the round written out."""
    if isinstance(policy, ScheduledLength) and sps is not None:
        return schedule_groups(rows, counts, getattr(sps, "convex", sps), step_cap)
    written = VerifyRound(write_out(windows, counts), write_out(rows, counts), step_cap, sps, None)
    return split_groups(policy.choose(written), counts)


SCHEDULED_MODES = ("dspark", "pipelined")


def make_policy(mode: str, confidence_threshold: float = 0.5) -> VerifyLengthPolicy:
    """The policy behind an `EngineConfig.scheduler` mode."""
    if mode in SCHEDULED_MODES:
        return ScheduledLength(pipelined=mode == "pipelined")
    if mode == "threshold":
        return ConfidenceThreshold(confidence_threshold)
    if mode in ("fixed", "mtp1", "plain"):
        return FixedLength()
    raise ValueError(f"unknown scheduler mode {mode!r}")


def window_limit(mode: str, gamma: int) -> int:
    """Drafted tokens per request per round in a mode: MTP-1 drafts one (verify window 2), plain none."""
    return {"mtp1": min(1, gamma), "plain": 0}.get(mode, gamma)
