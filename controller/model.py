"""What a replica is expected to deliver under a draft budget: the controller's throughput model.

The engine's prefix scheduler (dspark/scheduler.py, docs/ALGORITHM.md §7) maximises
Θ = τ · SPS(B) every step from live confidences. The controller plans over seconds from what the
replica *measured*: per-position acceptance α_k (conditional on the slots before being accepted)
and the cost table SPS(B), corrected by how much slower the forwards measured than the table says.
With R decoding requests sharing one survival curve a_j = α_1 ⋯ α_j, the best K drafted tokens in
a step are the K highest pairs of Algorithm 1's walk: every request's first ⌊K/R⌋ positions plus
K mod R requests one position deeper, so with x = K/R drafts per request and G the cumulative
survival interpolated linearly between whole depths,

    Θ(x; R) = R · (1 + G(x)) / t(R · (1 + x)),     t(B) = 1 / SPS(B) the step time.

No cliff, monotone caps. Planned over a table read linearly in *rate*, Θ had several local maxima
(the rate curve is convex where the hardware saturates), and the argmax jumped between them as load
moved: the step cap went 264 -> 542 -> 445 tokens from 200 to 220 to 400 requests. The controller
therefore plans with the step time the table implies under three physical facts (`SpsCurve`): a
larger forward is never faster; each extra token costs at least what the one before did (t convex:
the hardware saturates, it never un-saturates); and a forward of B tokens never takes longer per token
than a smaller one (it could be split). Then log t is convex in log B, so log Θ has decreasing
differences in (x, R), and
  - Θ(·; R) is quasi-concave: one optimum, and the slack band past it is one interval (the engine's
    early-stopping walk finds the same optimum);
  - the best drafts per request and the cap's drafts per request (`StepPlan.cap_depth`) never rise
    with load (Topkis): light load spends verify budget on latency, heavy load shrinks it;
  - the predicted throughput Θ*(R) never falls as load rises and one more request raises it by at most
    its own share: Θ*(R) ≤ Θ*(R + 1) ≤ (1 + 1/R) · Θ*(R).
Θ is linear-fractional between whole K (the breakpoints of G and of t are whole K), so the best K over
the integers is the best over all x, and the properties hold for the integer plan too.

Pure functions over plain floats; no Ray, no I/O.
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from dspark.scheduler import survival

Sps = Callable[[int], float]


class SpsCurve:
    """SPS(B) as the controller plans with it: 1 / t(B), with t the greatest step time not above the
    table as the engine reads it (slowdown / the rate interpolated linearly between points) that is
    non-decreasing, convex, and never longer per token than a smaller forward (see the module's
    docstring for why). Linear between whole-number knots, flat before the first, extended past the
    last along its last slope (the compute-bound regime).

    Where the engine's reading already has this shape it is kept; a dent or a rise in rate (noise,
    wave quantisation) is bridged from below, so the model errs towards more drafts, never fewer: the
    caps it derives are limits the engine chooses inside, and the engine still reads its own table."""

    def __init__(self, points: Sequence[int], rates: Sequence[float], slowdown: float = 1.0) -> None:
        if not points or len(points) != len(rates):
            raise ValueError("need one rate per point, at least one point")
        if any(b <= a for a, b in zip(points, points[1:])) or points[0] < 1:
            raise ValueError("points must be ascending and at least 1")
        if not all(r > 0 for r in rates) or slowdown <= 0:
            raise ValueError("rates and slowdown must be positive")
        self.points, self.rates, self.slowdown = tuple(points), tuple(rates), slowdown
        # The table as the engine reads it (linear in rate between points, dspark/cost_table.py), at
        # every whole batch size it covers (a stride keeps huge tables cheap; knots stay whole numbers).
        stride = max(1, (points[-1] - points[0]) // 4096)
        sizes = sorted({*range(points[0], points[-1], stride), *points})
        per_token, shaped = float("inf"), []
        for b, r in zip(sizes, np.interp(sizes, points, rates).tolist()):
            per_token = min(per_token, slowdown / r / b)  # a larger forward: never slower per token
            shaped.append((float(b), b * per_token))
        hull: list[tuple[float, float]] = []  # the lower convex hull (monotone chain)
        for p in shaped:
            while len(hull) >= 2 and _cross(hull[-2], hull[-1], p) <= 0:
                hull.pop()
            hull.append(p)
        lowest = min(range(len(hull)), key=lambda i: hull[i][1])  # flat before it: never faster when larger
        self.knots = tuple(hull[lowest:])
        self._sizes = [b for b, _ in self.knots]
        (b0, t0), (b1, t1) = self.knots[-2:] if len(self.knots) > 1 else (self.knots[0], self.knots[0])
        self.last_slope = 0.0 if b1 == b0 else (t1 - t0) / (b1 - b0)

    @classmethod
    def of(cls, table: Sequence[Sequence[float]], slowdown: float = 1.0) -> SpsCurve:
        """From the replicas' [[batch_tokens, rate], ...] form (deployments/replica_state.py); the same
        table and slowdown give the same (immutable) curve, built once."""
        return _curve(cls, tuple(int(b) for b, _ in table), tuple(float(r) for _, r in table), slowdown)

    def step_time(self, num_tokens: float) -> float:
        knots = self.knots
        if num_tokens <= knots[0][0]:
            return knots[0][1]
        i = bisect.bisect_left(self._sizes, num_tokens)
        if i == len(knots):
            b, t = knots[-1]
            return t + (num_tokens - b) * self.last_slope
        (b0, t0), (b1, t1) = knots[i - 1], knots[i]
        return t0 + (num_tokens - b0) * (t1 - t0) / (b1 - b0)

    def __call__(self, num_tokens: float) -> float:
        return 1.0 / self.step_time(num_tokens)


@functools.lru_cache(maxsize=256)
def _curve(
    cls: type[SpsCurve], points: tuple[int, ...], rates: tuple[float, ...], slowdown: float
) -> SpsCurve:
    """SpsCurve.of's curves, remembered: building one scans up to ~4,000 batch sizes (~5 ms), and the
    controller asks for every replica's every period, while replicas of one kind publish one table
    (the simulator's 1,000 GPU-class replicas: one table, one slowdown; the curve was 15 % of its run)."""
    return cls(points, rates, slowdown)


def _cross(o: tuple[float, float], a: tuple[float, float], b: tuple[float, float]) -> float:
    return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])


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
    cap_depth: float  # drafts per request where Θ leaves the slack band (cap_drafts = ⌊R · cap_depth⌋)


def plan_step(num_requests: int, acceptance: Sequence[float], sps: Sps, slack: float) -> StepPlan:
    """Where a step's drafted-token cap belongs at this load.

    The cap sits past the optimum, at the last K whose predicted throughput is still within
    `slack` of the best: it removes only drafts the model says clearly lose, and leaves the engine
    room to verify more for confident requests and less for the rest (a budget is a limit, never a
    target, docs/ARCHITECTURE.md §3). With `SpsCurve` both the best K / R and `cap_depth` never rise
    with load, and the best throughput moves with load without a jump (module docstring).
    """
    surv = survival(acceptance)
    most = num_requests * len(surv)
    if num_requests <= 0 or most == 0:
        return StepPlan(num_requests, 0, most, 0.0, 0.0, True, float(len(surv)))
    cumulative = [0.0]
    for a in surv:
        cumulative.append(cumulative[-1] + a)
    thetas = [  # Θ(K) as `throughput` computes it, with the survival summed once
        (num_requests + num_requests * cumulative[d] + (e * surv[d] if e else 0.0)) * sps(num_requests + k)
        for k in range(most + 1)
        for d, e in (divmod(k, num_requests),)
    ]
    best = max(range(most + 1), key=lambda k: (thetas[k], -k))
    level = (1 - slack) * thetas[best]
    cap = best
    while cap < most and thetas[cap + 1] >= level:
        cap += 1
    depth = float(len(surv))
    if cap < most:  # Θ is linear-fractional on [cap, cap + 1]: where it crosses the level, exactly
        tokens = [num_requests + expected_gain(num_requests, k, surv) for k in (cap, cap + 1)]
        seconds = [1.0 / sps(num_requests + k) for k in (cap, cap + 1)]
        above = tokens[0] - level * seconds[0]
        below = tokens[1] - level * seconds[1]
        depth = (cap + above / (above - below)) / num_requests
    return StepPlan(num_requests, best, cap, thetas[best], thetas[0], cap == most, depth)


def per_user_rate(
    requests: int, own_drafts: float, acceptance: Sequence[float], batch_tokens: int, sps: Sps
) -> float:
    """Tokens per second one request sees verifying `own_drafts` drafts in a forward of `batch_tokens`."""
    surv = survival(acceptance)
    depth = min(int(own_drafts), len(surv))
    tau = 1.0 + sum(surv[:depth])
    return tau * sps(max(batch_tokens, requests))
