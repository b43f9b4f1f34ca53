"""Calibration error of the drafter's confidences against observed acceptance (pure).

A round that verified n drafted tokens with predicted prefix survival s_1..s_n and accepted a of them
gives n (confidence, outcome) pairs: (s_i, i <= a). Perfect calibration means that among pairs with
confidence near c, a fraction c were accepted. The expected calibration error (ECE) is the
pair-weighted mean gap |mean confidence - accepted fraction| over equal-width confidence bins.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable


def expected_calibration_error(pairs: Iterable[tuple[float, bool]], bins: int = 10) -> float | None:
    """ECE over `bins` equal-width bins of [0, 1]; None when there are no pairs."""
    if bins < 1:
        raise ValueError("bins must be >= 1")
    count = [0] * bins
    confidence = [0.0] * bins
    hits = [0] * bins
    for c, accepted in pairs:
        b = min(int(c * bins), bins - 1) if c > 0 else 0
        count[b] += 1
        confidence[b] += c
        hits[b] += bool(accepted)
    total = sum(count)
    if total == 0:
        return None
    return sum(abs(confidence[b] - hits[b]) for b in range(bins) if count[b]) / total


def round_pairs(survival: Iterable[float], accepted: int) -> list[tuple[float, bool]]:
    """The (confidence, accepted) pairs of one verify round: position i counts as accepted if i < accepted."""
    return [(s, i < accepted) for i, s in enumerate(survival)]


class CalibrationWindow:
    """ECE over the most recent `max_rounds` verify rounds that carried confidences.

    Rounds are appended on the engine thread and read on the metrics thread, hence the lock; a round
    is kept whole and expanded into pairs only when the error is read.
    """

    def __init__(self, max_rounds: int = 4096, bins: int = 10) -> None:
        self.bins = bins
        self._rounds: deque[tuple[tuple[float, ...], int]] = deque(maxlen=max_rounds)
        self._lock = threading.Lock()

    def add(self, survival: Iterable[float], accepted: int) -> None:
        survival = tuple(survival)
        if survival:
            with self._lock:
                self._rounds.append((survival, accepted))

    def error(self) -> float | None:
        with self._lock:
            rounds = list(self._rounds)
        return expected_calibration_error(
            (pair for survival, accepted in rounds for pair in round_pairs(survival, accepted)), self.bins
        )
