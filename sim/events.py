"""The simulated clock: a priority queue of timed callbacks, deterministic under equal times."""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any


class EventQueue:
    """Callbacks ordered by time, then by the order they were scheduled (so a run is reproducible)."""

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[..., Any], tuple]] = []
        self._seq = 0
        self.processed = 0

    def at(self, time: float, fn: Callable[..., Any], *args: Any) -> None:
        if time < self.now:
            raise ValueError(f"cannot schedule at {time} before now {self.now}")
        heapq.heappush(self._heap, (time, self._seq, fn, args))
        self._seq += 1

    def after(self, delay: float, fn: Callable[..., Any], *args: Any) -> None:
        self.at(self.now + delay, fn, *args)

    def run(self, until: float, tick: Callable[[float], None] | None = None) -> None:
        """Process every event up to `until` (inclusive); `tick(now)` after each (progress bars)."""
        heap = self._heap
        while heap and heap[0][0] <= until:
            time, _, fn, args = heapq.heappop(heap)
            self.now = time
            fn(*args)
            self.processed += 1
            if tick is not None:
                tick(time)
        self.now = max(self.now, until)

    def __len__(self) -> int:
        return len(self._heap)
