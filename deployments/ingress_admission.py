"""Admission at the ingress: a bounded count of the generation requests one ingress replica holds.

A request takes a slot before any work is done for it (tokenization, routing) and gives it back when
its stream ends, however it ends. The bound is what this ingress' streams can run on every target
replica at once plus `max_queued_requests` waiting behind them. Past it the newcomer gets
AdmissionError: 429 / RESOURCE_EXHAUSTED with a retry hint (deployments/errors.py), where Serve's own
queue overflow would answer 503 with, at best, a fixed Retry-After.

The retry hint is the time the queue ahead of a newcomer takes to drain at the rate requests have been
finishing here (over the last DRAIN_WINDOW_S): a request admitted now would wait about that long.
Before any request has finished there is no rate, and the hint is MIN_RETRY_S.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from dspark.errors import AdmissionError

DRAIN_WINDOW_S = 10.0
MIN_RETRY_S = 1.0  # what Retry-After can say at least (whole seconds), and the engine's own refusal
MAX_RETRY_S = 30.0


class Slot:
    """One admitted request's place; `release` is idempotent (a stream's end and its collection)."""

    def __init__(self, admission: IngressAdmission) -> None:
        self._admission: IngressAdmission | None = admission

    def release(self) -> None:
        if self._admission is not None:
            self._admission.leave()
            self._admission = None


class IngressAdmission:
    def __init__(self, running: int, queued: int | None, clock: Callable[[], float] = time.monotonic) -> None:
        """`running`: streams that can run on the target replicas at once; `queued`: how many more may
        wait (None: no bound)."""
        self.running = running
        self.limit = None if queued is None else running + queued
        self.in_flight = 0
        self._clock = clock
        self._started = clock()
        self._finished: deque[float] = deque()  # when requests ended, within the drain window

    def enter(self) -> Slot:
        if self.limit is not None and self.in_flight >= self.limit:
            retry = self.retry_after_s()
            raise AdmissionError(
                f"ingress full: {self.in_flight} requests in flight on this ingress replica "
                f"(limit {self.limit}: {self.running} running + {self.limit - self.running} queued)",
                retry,
            )
        self.in_flight += 1
        return Slot(self)

    def leave(self) -> None:
        self.in_flight -= 1
        now = self._clock()
        self._finished.append(now)
        self._forget_before(now - DRAIN_WINDOW_S)

    def drain_rate(self) -> float | None:
        """Requests finished per second over the last DRAIN_WINDOW_S (or since start, if shorter)."""
        now = self._clock()
        self._forget_before(now - DRAIN_WINDOW_S)
        if not self._finished:
            return None
        return len(self._finished) / max(min(DRAIN_WINDOW_S, now - self._started), 1e-3)

    def retry_after_s(self) -> float:
        rate = self.drain_rate()
        if rate is None:
            return MIN_RETRY_S
        ahead = max(1, self.in_flight - self.running)
        return round(min(MAX_RETRY_S, max(MIN_RETRY_S, ahead / rate)), 1)

    def _forget_before(self, cutoff: float) -> None:
        while self._finished and self._finished[0] < cutoff:
            self._finished.popleft()
