"""Seeded request streams: when requests arrive, how long they are, which SLA class and domain.

Arrivals are a Poisson process whose rate follows a pattern (constant, bursty on/off, diurnal), drawn by
thinning, so every pattern has the same mean rate and the same seed gives the same trace. Prompt and
output lengths are log-normal; a small share of prompts is long-context (multiplied by a heavy factor),
the tail that fills KV caches. The domain picks the acceptance profile (chat, code, math acceptance
differ by a factor of two in the paper, docs/ALGORITHM.md), the SLA class the request's targets.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

PATTERNS = ("poisson", "bursty", "diurnal")


@dataclass(frozen=True)
class Workload:
    rate: float  # mean requests per second
    duration_s: float
    pattern: str = "poisson"
    seed: int = 0
    classes: Mapping[str, float] = field(default_factory=lambda: {"interactive": 0.5, "standard": 0.5})
    domains: Mapping[str, float] = field(default_factory=lambda: {"chat": 0.5, "code": 0.3, "math": 0.2})
    prompt_median: float = 512
    prompt_sigma: float = 0.8
    output_median: float = 192
    output_sigma: float = 0.7
    long_prompt_share: float = 0.03  # long-context tail: these prompts are multiplied by long_prompt_factor
    long_prompt_factor: float = 12.0
    max_prompt: int = 16384
    max_output: int = 2048
    burst_on_s: float = 10.0  # bursty: on for this long at rate * (on + off) / on, then off
    burst_off_s: float = 10.0
    diurnal_period_s: float = 600.0  # diurnal: rate * (1 + amplitude * sin(2 pi t / period))
    diurnal_amplitude: float = 0.6

    def __post_init__(self) -> None:
        if self.pattern not in PATTERNS:
            raise ValueError(f"pattern must be one of {PATTERNS}, got {self.pattern!r}")
        if not self.rate > 0 or not self.duration_s > 0:
            raise ValueError("rate and duration_s must be > 0")
        if not 0 <= self.diurnal_amplitude < 1:
            raise ValueError("diurnal_amplitude must be in [0, 1)")

    def rate_at(self, t: float) -> float:
        if self.pattern == "bursty":
            cycle = self.burst_on_s + self.burst_off_s
            on = (t % cycle) < self.burst_on_s
            return self.rate * cycle / self.burst_on_s if on else 0.0
        if self.pattern == "diurnal":
            return self.rate * (
                1 + self.diurnal_amplitude * math.sin(2 * math.pi * t / self.diurnal_period_s)
            )
        return self.rate

    def peak_rate(self) -> float:
        if self.pattern == "bursty":
            return self.rate * (self.burst_on_s + self.burst_off_s) / self.burst_on_s
        if self.pattern == "diurnal":
            return self.rate * (1 + self.diurnal_amplitude)
        return self.rate


@dataclass(slots=True)
class Request:
    rid: int
    arrival: float
    prompt_tokens: int
    max_tokens: int  # also the output length: requests run to max_tokens, as the benchmarks' ignore_eos
    sla_class: str
    domain: str
    # The prompt's token ids, where the trace knows them (bench/sim_validate.py's real prompts): a replica
    # whose engine caches prefixes reuses the pages earlier prompts share with it (sim/replica.py), and
    # the SLA router predicts that reuse (router/policy.py Newcomer.prefix). None: nothing to share.
    prompt_ids: tuple[int, ...] | None = None
    # Outcome, filled in by the simulation.
    replica: str | None = None
    first_token: float | None = None
    finish: float | None = None
    generated: int = 0
    outcome: str = "pending"  # pending | done | shed | refused | failed
    # Its time to first token in parts: the engine took it (`admitted`: routed to its replica; after
    # the serving path and any wait in the router's queue) and ran its first prompt chunk (`scheduled`).
    admitted: float | None = None
    scheduled: float | None = None
    # The first token's way back to the client (the serving path's outbound part), already in
    # `first_token` and `finish` (the client's view): every token is that much later, so TPOT keeps.
    path_back: float = 0.0

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.arrival

    @property
    def ttft_parts(self) -> tuple[float, float, float] | None:
        """(serving path, engine queue, prefill) adding up to its TTFT: arrival to admitted plus the first
        token's way back, admitted to its first prompt chunk, that chunk to the engine's first token (None
        before its first token)."""
        if self.first_token is None or self.admitted is None or self.scheduled is None:
            return None
        path = self.admitted - self.arrival + self.path_back
        return path, self.scheduled - self.admitted, self.first_token - self.path_back - self.scheduled

    @property
    def tpot(self) -> float | None:
        if self.finish is None or self.first_token is None:
            return None
        return (self.finish - self.first_token) / (self.generated - 1) if self.generated > 1 else 0.0


def generate(w: Workload) -> list[Request]:
    """The trace: every request of the workload in arrival order."""
    rng = np.random.default_rng(w.seed)
    peak = w.peak_rate()
    # Thinning: candidates at the peak rate, each kept with probability rate(t) / peak.
    expected = int(peak * w.duration_s * 1.2 + 100)
    times: list[float] = []
    t = 0.0
    while True:
        gaps = rng.exponential(1.0 / peak, expected)
        keep = rng.random(expected)
        for gap, u in zip(gaps, keep):
            t += gap
            if t >= w.duration_s:
                break
            if u * peak < w.rate_at(t):
                times.append(t)
        else:
            continue
        break
    n = len(times)
    prompts = rng.lognormal(math.log(w.prompt_median), w.prompt_sigma, n)
    prompts = np.where(rng.random(n) < w.long_prompt_share, prompts * w.long_prompt_factor, prompts)
    prompts = np.clip(np.rint(prompts), 1, w.max_prompt).astype(int)
    outputs = np.clip(np.rint(rng.lognormal(math.log(w.output_median), w.output_sigma, n)), 1, w.max_output)
    classes = _choose(rng, w.classes, n)
    domains = _choose(rng, w.domains, n)
    return [Request(i, times[i], int(prompts[i]), int(outputs[i]), classes[i], domains[i]) for i in range(n)]


def _choose(rng: np.random.Generator, weights: Mapping[str, float], n: int) -> list[str]:
    names = sorted(weights)
    p = np.array([weights[k] for k in names], dtype=float)
    if (p < 0).any() or p.sum() <= 0:
        raise ValueError(f"weights must be >= 0 with a positive sum: {dict(weights)}")
    return [names[i] for i in rng.choice(len(names), size=n, p=p / p.sum())]
