"""The machine's speed wander: a host's steps run slower and faster over time, for reasons of its own.

One engine alone on this machine, one request at a time, steps at a speed that wanders: its decode steps'
log time has an sd of about 0.2 around their median, and it is correlated over hundreds of milliseconds
(0.91 one step apart, 0.47 a third of a second apart), so a request's mean step, over its ~60 steps,
still parts from the others' by a log sd of 0.18 (bench/results/step_noise.json, 09:09; at 15:25 the
same measurement read 0.08 and 0.05: the wander itself changes over a day). Two engines pinned to the two
cores wander largely together (their mean log forward over 20 ms windows correlates 0.41, over 1 s 0.73:
bench/results/host_wander.json), so the slow part is taken as the host's, shared by its engines, and
the rest as each step's own. The profile's step model prices a step by its batch alone, so without the
wander the simulated requests' TPOT is half as spread as the real ones' (the validation's per-request
TPOT, sd over mean 0.16 simulated, 0.31-0.38 real).

Model: a step's time is multiplied by exp(x(t) + e - v / 2): x(t) the host's slow part, an
Ornstein-Uhlenbeck process in log time with stationary sd `slow_log_sd` and correlation exp(-lag /
correlation_s); e each step's own part, independent, sd `white_log_sd`; v the sum of their variances, so
the multiplier's mean is 1 and the profile's step costs (fitted to measured means) keep their mean.
The process is sampled when a step starts, exactly for any gap between samples.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class StepNoise:
    """A profile's `step_noise` block: the wander's size and memory (module docstring)."""

    slow_log_sd: float
    correlation_s: float
    white_log_sd: float = 0.0

    def __post_init__(self) -> None:
        if not (self.slow_log_sd >= 0 and self.white_log_sd >= 0 and self.correlation_s > 0):
            raise ValueError(f"step_noise needs sds >= 0 and correlation_s > 0, got {self}")

    @classmethod
    def from_json(cls, data: Mapping | None) -> StepNoise | None:
        if not data:
            return None
        return cls(
            float(data["slow_log_sd"]), float(data["correlation_s"]), float(data.get("white_log_sd", 0.0))
        )


class Wander:
    """One host's speed over time: the multiplier of a step started at `now` (`factor`)."""

    def __init__(self, noise: StepNoise, rng: random.Random, start: float = 0.0) -> None:
        self.noise, self.rng = noise, rng
        self._t = start
        self._x = rng.gauss(0.0, noise.slow_log_sd)  # from the stationary law: no warm-up
        self._mean_shift = (noise.slow_log_sd**2 + noise.white_log_sd**2) / 2

    def factor(self, now: float) -> float:
        noise, gauss = self.noise, self.rng.gauss
        gap = now - self._t
        if gap > 0:
            keep = math.exp(-gap / noise.correlation_s)
            self._x = self._x * keep + noise.slow_log_sd * math.sqrt(1.0 - keep * keep) * gauss(0.0, 1.0)
            self._t = now
        own = gauss(0.0, noise.white_log_sd) if noise.white_log_sd else 0.0
        return math.exp(self._x + own - self._mean_shift)
