"""Which engine steps become span events: an exact share, spread evenly (pure)."""

from __future__ import annotations


class StepSampler:
    """Samples `rate` of the calls to `sample()`, deterministically: with rate 0.25 every fourth.

    A credit grows by `rate` per step and a step is taken whenever it reaches 1, so over any n steps
    the count taken is within one of n * rate, with no random draws on the engine thread.
    """

    def __init__(self, rate: float) -> None:
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"rate must be in [0, 1], got {rate}")
        self.rate = rate
        self._credit = 0.0

    def sample(self) -> bool:
        self._credit += self.rate
        if self._credit >= 1.0 - 1e-12:
            self._credit -= 1.0
            return True
        return False
