"""Closed-loop recalibration, as decisions (pure): STS temperatures refitted from the rounds every replica
observed, and cost tables rescaled when the forwards drift from them.

Both change only *which* drafted tokens the engine verifies, never how a verified token is accepted
(docs/ALGORITHM.md §6–§7), so both are lossless.

STS. A replica reports each verify round as the prefix survivals a_1..a_n its engine computed (with
the STS temperatures in force, T_k) and how many of the n drafts were accepted. The confidence of slot
k is c_k = a_k / a_{k-1} = σ(ĉ_k / T_k), so the raw logit is ĉ_k = T_k · logit(c_k): the pooled rounds of
all replicas become the raw material of the repository's own fit (drafter_service/calibration/sts.py,
docs/ALGORITHM.md §4), which is refitted when the pooled calibration error drifts past a threshold and
the new temperatures are pushed only if they lower it by a margin.

SPS. A replica reports its forwards' measured time over the time its cost table predicts for them.
When that slowdown stays outside a band for several windows on the same side, the table is rescaled
by it (the engine's own moving average heals only the buckets it happens to visit).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

EPS = 1e-6


@dataclass(frozen=True)
class ObservedRound:
    survival: tuple[float, ...]  # a_1..a_n the engine computed for the n drafts it verified
    accepted: int  # drafts accepted (a prefix)
    temperature: float = 1.0  # the request's sampling temperature (STS sets are per serving temperature)


def raw_logits(survival: Sequence[float], temperatures: Sequence[float]) -> list[float]:
    """The confidence head's raw logits ĉ_k behind survivals computed with `temperatures`."""
    out, previous = [], 1.0
    for k, a in enumerate(survival):
        c = min(1 - EPS, max(EPS, a / previous if previous > 0 else 0.0))
        out.append(temperatures[k] * math.log(c / (1 - c)))
        previous = a
    return out


@dataclass(frozen=True)
class Refit:
    temperature: float  # the serving temperature the set belongs to
    temperatures: list[float]  # T_1..T_γ
    ece_before: float
    ece_after: float
    rounds: int


class CalibrationPool:
    """The most recent rounds of all replicas, per serving temperature."""

    def __init__(self, max_rounds: int = 20_000) -> None:
        self.max_rounds = max_rounds
        self._rounds: dict[float, deque[ObservedRound]] = {}

    def add(self, rounds: Iterable[ObservedRound]) -> None:
        for r in rounds:
            if r.survival:
                self._rounds.setdefault(r.temperature, deque(maxlen=self.max_rounds)).append(r)

    def temperatures(self) -> list[float]:
        return sorted(self._rounds)

    def rounds(self, temperature: float) -> list[ObservedRound]:
        return list(self._rounds.get(temperature, ()))

    def clear(self, temperature: float) -> None:
        """Rounds computed with the old temperatures say nothing about the new ones."""
        self._rounds.pop(temperature, None)


def refit(
    rounds: Sequence[ObservedRound],
    in_force: Sequence[float],
    threshold: float = 0.05,
    min_rounds: int = 200,
    min_gain: float = 0.005,
) -> Refit | None:
    """New STS temperatures when the pooled calibration error exceeds `threshold` and the refit lowers
    it by at least `min_gain`; None otherwise (too few rounds, calibrated enough, or no better)."""
    if len(rounds) < min_rounds:
        return None
    import torch  # only here: the rest of the controller stays light

    from drafter_service.calibration.sts import calibration_report, fit_sts

    gamma = len(in_force)
    logits = torch.zeros(len(rounds), gamma)
    for i, r in enumerate(rounds):
        row = raw_logits(r.survival[:gamma], in_force)
        logits[i, : len(row)] = torch.tensor(row)
    accepted = torch.tensor([r.accepted for r in rounds])
    verified = torch.tensor([min(len(r.survival), gamma) for r in rounds])
    before = calibration_report(logits, accepted, verified, list(in_force))["ece_sts"]
    if before <= threshold:
        return None
    temperatures = fit_sts(logits, accepted, verified)
    after = calibration_report(logits, accepted, verified, temperatures)["ece_sts"]
    if before - after < min_gain:
        return None
    return Refit(rounds[0].temperature, temperatures, before, after, len(rounds))


@dataclass(frozen=True)
class TableRefresh:
    replica_id: str
    slowdown: float  # measured forward time / the table's: rates are divided by it


class DriftWatch:
    """Per replica, whether its forwards stayed off its cost table long enough to rescale the table."""

    def __init__(self, band: float = 0.15, windows: int = 3) -> None:
        self.band, self.windows = band, windows
        self._history: dict[str, deque[float]] = {}

    def observe(self, replica_id: str, slowdown: float) -> TableRefresh | None:
        history = self._history.setdefault(replica_id, deque(maxlen=self.windows))
        history.append(slowdown)
        if len(history) < self.windows:
            return None
        slower = all(s > 1 + self.band for s in history)
        faster = all(s < 1 / (1 + self.band) for s in history)
        if not (slower or faster):
            return None
        factor = statistics.median(history)
        history.clear()  # the rescaled table is the new reference
        return TableRefresh(replica_id, factor)

    def forget(self, replica_id: str) -> None:
        self._history.pop(replica_id, None)
