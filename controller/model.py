"""What a replica is expected to deliver under a draft budget: the controller's throughput model.

The engine's prefix scheduler (dspark/scheduler.py, docs/ALGORITHM.md §7) maximises
Θ = τ · SPS(B) every step from live confidences. The controller plans over seconds from what the
replica *measured*: per-position acceptance α_k (conditional on the slots before being accepted)
and the cost table SPS(B), corrected by how much slower the forwards measured than the table says.
With R decoding requests sharing one survival curve a_j = α_1 ⋯ α_j, the best K drafted tokens in
a step are the K highest pairs of Algorithm 1's walk: every request's first ⌊K/R⌋ positions plus
K mod R requests one position deeper, so

    Θ(K) = (R + R·Σ_{j≤⌊K/R⌋} a_j + (K mod R)·a_{⌊K/R⌋+1}) · SPS(R + K)

which is piecewise linear in K and, through SPS, smooth in R: caps derived from it have no
batch-size thresholds, hence no throughput cliffs (the failure of vLLM's batch-size table).

Pure functions over plain floats; no Ray, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dspark.scheduler import survival

Sps = Callable[[int], float]


@dataclass(frozen=True)
class SpsCurve:
    """SPS(B) from a table of (batch tokens, verify steps per second), linear in between, flat outside,
    divided by `slowdown` (measured forward time / the table's): the table as the replica runs today."""

    points: tuple[int, ...]
    rates: tuple[float, ...]
    slowdown: float = 1.0

    def __post_init__(self) -> None:
        if not self.points or len(self.points) != len(self.rates):
            raise ValueError("need one rate per point, at least one point")
        if any(b <= a for a, b in zip(self.points, self.points[1:])):
            raise ValueError("points must be ascending")
        if not all(r > 0 for r in self.rates) or self.slowdown <= 0:
            raise ValueError("rates and slowdown must be positive")

    @classmethod
    def of(cls, table: Sequence[Sequence[float]], slowdown: float = 1.0) -> SpsCurve:
        """From the replicas' [[batch_tokens, rate], ...] form (deployments/replica_state.py)."""
        return cls(tuple(int(b) for b, _ in table), tuple(float(r) for _, r in table), slowdown)

    def __call__(self, num_tokens: int) -> float:
        pts, rates = self.points, self.rates
        if num_tokens <= pts[0]:
            return rates[0] / self.slowdown
        for i in range(1, len(pts)):
            if num_tokens <= pts[i]:
                frac = (num_tokens - pts[i - 1]) / (pts[i] - pts[i - 1])
                return (rates[i - 1] + frac * (rates[i] - rates[i - 1])) / self.slowdown
        return rates[-1] / self.slowdown


def tau_of_geometric(alpha: float, length: float) -> float:
    """Expected tokens per round verifying `length` drafts whose slots each survive with `alpha`."""
    whole = int(length)
    tau = sum(alpha**j for j in range(whole + 1))
    return tau + (length - whole) * alpha ** (whole + 1)


def fit_geometric_acceptance(tau: float, mean_verified: float) -> float | None:
    """The per-slot acceptance α whose geometric law gives the measured τ at `mean_verified` drafts
    per round (what a replica's routing stats tell); None when the window verified nothing."""
    if mean_verified <= 0 or tau <= 0:
        return None
    if tau >= 1 + mean_verified:
        return 0.999
    lo, hi = 0.0, 0.999
    for _ in range(40):  # τ rises with α: bisection
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if tau_of_geometric(mid, mean_verified) < tau else (lo, mid)
    return (lo + hi) / 2


def expected_gain(num_requests: int, drafts: int, surv: Sequence[float]) -> float:
    """Expected accepted drafted tokens from the `drafts` best pairs of `num_requests` like requests."""
    if num_requests <= 0 or drafts <= 0:
        return 0.0
    depth, extra = divmod(min(drafts, num_requests * len(surv)), num_requests)
    gain = num_requests * sum(surv[:depth])
    return gain + (extra * surv[depth] if extra else 0.0)


def throughput(num_requests: int, drafts: int, surv: Sequence[float], sps: Sps) -> float:
    """Θ(K): expected tokens per second of one replica verifying `drafts` drafted tokens per step."""
    if num_requests <= 0:
        return 0.0
    return (num_requests + expected_gain(num_requests, drafts, surv)) * sps(num_requests + drafts)


@dataclass(frozen=True)
class StepPlan:
    """The model's view of one replica at one load: the best drafts per step and how far a cap may go."""

    num_requests: int
    best_drafts: int  # argmax Θ(K)
    cap_drafts: int  # the largest K past the best whose Θ stays within `slack` of it: the cap
    best_throughput: float  # Θ(best_drafts), tokens/s
    plain_throughput: float  # Θ(0): no drafting
    unconstrained: bool  # every pair pays: no cap needed


def plan_step(num_requests: int, acceptance: Sequence[float], sps: Sps, slack: float) -> StepPlan:
    """Where a step's drafted-token cap belongs at this load.

    The cap sits past the optimum, at the last K whose predicted throughput is still within
    `slack` of the best: it removes only drafts the model says clearly lose, and leaves the engine
    room to verify more for confident requests and less for the rest (a budget is a limit, never a
    target, docs/ARCHITECTURE.md §3).
    """
    surv = survival(acceptance)
    most = num_requests * len(surv)
    if num_requests <= 0 or most == 0:
        return StepPlan(num_requests, 0, most, 0.0, 0.0, True)
    thetas = [throughput(num_requests, k, surv, sps) for k in range(most + 1)]
    best = max(range(most + 1), key=lambda k: (thetas[k], -k))
    cap = best
    while cap < most and thetas[cap + 1] >= (1 - slack) * thetas[best]:
        cap += 1
    return StepPlan(num_requests, best, cap, thetas[best], thetas[0], cap == most)


def per_user_rate(
    requests: int, own_drafts: float, acceptance: Sequence[float], batch_tokens: int, sps: Sps
) -> float:
    """Tokens per second one request sees verifying `own_drafts` drafts in a forward of `batch_tokens`."""
    surv = survival(acceptance)
    depth = min(int(own_drafts), len(surv))
    tau = 1.0 + sum(surv[:depth])
    return tau * sps(max(batch_tokens, requests))
