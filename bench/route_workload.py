"""The routing benchmark's load and its scoring, as pure functions (bench/route.py runs them on Serve).

Load: open-loop Poisson arrivals at a fixed rate for a fixed window, each request of one SLA class
(drawn by the classes' shares) with prompt and output lengths from a seeded log-normal. A schedule is a
function of its seed alone, so every arm replays exactly the same requests at the same instants.

Scoring. A request meets its SLA when it completed with TTFT <= its class's target and TPOT <= its
target (a one-token answer has no TPOT); a refused or failed request does not. Attainment is the
fraction of the requests sent that met their SLA. Goodput, as in DistServe: the most requests per
second meeting their SLA at any load where attainment is at least 90%; 0 when no load reaches it.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class SlaTarget:
    name: str
    share: float  # of the requests
    ttft_s: float
    tpot_s: float


@dataclass(frozen=True)
class Arrival:
    at_s: float  # since the window opened
    sla_class: str
    prompt_tokens: int
    max_tokens: int


@dataclass(frozen=True)
class Lengths:
    """Log-normal token counts: the median, the spread (sigma of the log), clipped to [low, high]."""

    median: float
    sigma: float
    low: int
    high: int

    def draw(self, rng: random.Random) -> int:
        return min(self.high, max(self.low, round(rng.lognormvariate(math.log(self.median), self.sigma))))


@dataclass(frozen=True)
class Outcome:
    arrival: Arrival
    status: str  # "ok" | "refused" (429 / RESOURCE_EXHAUSTED) | "error"
    ttft_s: float | None = None
    tpot_s: float | None = None  # None: fewer than two tokens
    tokens: int = 0


def schedule(
    rate: float,
    window_s: float,
    classes: Sequence[SlaTarget],
    prompt: Lengths,
    output: Lengths,
    seed: int,
) -> list[Arrival]:
    """Poisson arrivals at `rate` per second over `window_s` seconds."""
    rng = random.Random(seed)
    names = [c.name for c in classes]
    shares = [c.share for c in classes]
    arrivals, t = [], rng.expovariate(rate)
    while t < window_s:
        name = rng.choices(names, shares)[0]
        arrivals.append(Arrival(t, name, prompt.draw(rng), output.draw(rng)))
        t += rng.expovariate(rate)
    return arrivals


def met(outcome: Outcome, target: SlaTarget) -> bool:
    if outcome.status != "ok" or outcome.ttft_s is None or outcome.ttft_s > target.ttft_s:
        return False
    return outcome.tpot_s is None or outcome.tpot_s <= target.tpot_s


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100), linear between closest ranks; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def score(outcomes: Sequence[Outcome], targets: Sequence[SlaTarget], window_s: float) -> dict:
    """One load point: attainment (all and per class), goodput at this load, latencies, refusals."""
    by_name = {t.name: t for t in targets}
    hits = [met(o, by_name[o.arrival.sla_class]) for o in outcomes]
    done = [o for o in outcomes if o.status == "ok"]

    def ms(values: list[float], q: float) -> float | None:
        p = percentile(values, q)
        return None if p is None else round(p * 1e3, 2)

    ttfts = [o.ttft_s for o in done if o.ttft_s is not None]
    tpots = [o.tpot_s for o in done if o.tpot_s is not None]
    per_class = {}
    for t in targets:
        mine = [h for o, h in zip(outcomes, hits) if o.arrival.sla_class == t.name]
        per_class[t.name] = round(sum(mine) / len(mine), 4) if mine else None
    return {
        "sent": len(outcomes),
        "attainment": round(sum(hits) / len(outcomes), 4) if outcomes else None,
        "attainment_by_class": per_class,
        "met_rps": round(sum(hits) / window_s, 4),
        "refused": sum(o.status == "refused" for o in outcomes),
        "errors": sum(o.status == "error" for o in outcomes),
        "ttft_p50_ms": ms(ttfts, 50),
        "ttft_p99_ms": ms(ttfts, 99),
        "tpot_p50_ms": ms(tpots, 50),
        "tpot_p99_ms": ms(tpots, 99),
    }


def goodput(points: Sequence[dict], min_attainment: float = 0.9) -> float:
    """The most SLA-meeting requests per second over the points whose attainment reaches the bar."""
    return max(
        (p["met_rps"] for p in points if p["attainment"] is not None and p["attainment"] >= min_attainment),
        default=0.0,
    )


def goodput_interpolated(points: Sequence[dict], min_attainment: float = 0.9) -> float:
    """Goodput without the grid's step: the met rate where attainment first falls below the bar,
    interpolated linearly between the last point at or above it and the next one (by offered rate). Two arms
    whose attainment at one point falls either side of 0.9 by a hair no longer differ by a whole point
    of load. 0 when the first point is already below the bar; the best met rate when none is."""
    ordered = sorted((p for p in points if p["attainment"] is not None), key=lambda p: p["rate_rps"])
    best = 0.0
    for below, above in zip([None, *ordered], ordered):
        if above["attainment"] >= min_attainment:
            best = max(best, above["met_rps"])
            continue
        if below is None:
            return 0.0
        share = (below["attainment"] - min_attainment) / (below["attainment"] - above["attainment"])
        return round(below["met_rps"] + share * (above["met_rps"] - below["met_rps"]), 4)
    return best


def mean_points(repeats: Sequence[Sequence[dict]]) -> list[dict]:
    """Per load point, the mean over repeats of every numeric field (None where any repeat has none)."""
    out = []
    for same_load in zip(*repeats):
        merged: dict = {}
        for key, value in same_load[0].items():
            values = [p[key] for p in same_load]
            if isinstance(value, dict):
                merged[key] = {
                    k: None
                    if any(v[k] is None for v in values)
                    else round(sum(v[k] for v in values) / len(values), 4)
                    for k in value
                }
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                merged[key] = None if any(v is None for v in values) else round(sum(values) / len(values), 4)
            else:
                merged[key] = None if any(v is None for v in values) else value
        out.append(merged)
    return out


SETTINGS = ("heterogeneous", "uniform", "drafter_vs_plain")


def setting_engines(setting: str, drafter: dict, max_num_seqs: int, small_max_num_seqs: int) -> list[dict]:
    """The engine options of each replica (by Serve rank) in `setting`; `drafter` is the speculation
    every replica runs unless the setting says otherwise.
      heterogeneous:    the same engine, rank 1 with fewer sequence slots (max_num_seqs): on a small CPU
                        box a real difference in capacity (by the target's profiled cost table, 8
                        requests of 8 tokens a step make ~1.8x the tokens per second of 2), which
                        Serve's routers cannot see: they send each replica up to the deployment's one
                        max_ongoing_requests, and the small one refuses what it has no slot for;
      uniform:          the control, both as rank 0;
      drafter_vs_plain: rank 1 without speculation (on this box the drafter gains little: tau ~2 at a
                        step 1.78x a plain one, so the two replicas run at nearly the same speed)."""
    big = {**drafter, "max_num_seqs": max_num_seqs}
    if setting == "heterogeneous":
        return [big, {**drafter, "max_num_seqs": small_max_num_seqs}]
    if setting == "uniform":
        return [big, dict(big)]
    if setting == "drafter_vs_plain":
        return [big, {"drafter": "none", "max_num_seqs": max_num_seqs}]
    raise ValueError(f"unknown setting {setting!r}; known: {', '.join(SETTINGS)}")


def engine_kind(speculates: bool, max_num_seqs: int) -> str:
    """A replica's kind as the benchmark checks it: speculating or not, and its sequence slots."""
    return f"{'drafter' if speculates else 'plain'} x{max_num_seqs}"


def expected_kinds(engines: Sequence[dict]) -> list[str]:
    """The kinds the replicas of these engine options report, sorted."""
    return sorted(engine_kind(e.get("drafter", "none") != "none", e["max_num_seqs"]) for e in engines)


def kinds_problem(setting: str, engines: Sequence[dict], kinds: Sequence[str]) -> str | None:
    """Why the replicas up are not the setting's mix, or None. During a rolling redeploy Serve can hand out
    ranks {0, 2}, and the replicas run rank 0's engine twice until Serve compacts the ranks and the moved
    replica rebuilds (deployments/replica_engine.py): a pool caught mid-way is not measured."""
    expected = expected_kinds(engines)
    if sorted(kinds) != expected:
        return f"{setting} setting expects replicas {expected}, got {sorted(kinds)}"
    return None


def arm_order(arms: Sequence[str], repeat: int) -> list[str]:
    """The arms' order in one repeat: pow2 first in even repeats, last in odd ones. This machine's speed
    drifts within minutes, so the arms take turns (interleaved repeats, counterbalanced positions)
    rather than one arm running all its repeats before the next: a drift then falls on every arm alike."""
    ordered = sorted(arms, key=lambda a: (a != "pow2", a))
    return ordered if repeat % 2 == 0 else ordered[::-1]


def spread(values: Sequence[float]) -> float | None:
    """(max - min) / mean: how far identical runs fell apart. None for fewer than two or a zero mean."""
    if len(values) < 2 or sum(values) <= 0:
        return None
    return round((max(values) - min(values)) / (sum(values) / len(values)), 4)


def noise_band(repeats: Sequence[Sequence[dict]], field: str = "met_rps") -> float | None:
    """The largest spread of `field` over identical repeats (the same schedules) at any load point."""
    spreads = [spread([p[field] for p in same_load]) for same_load in zip(*repeats)]
    return max((s for s in spreads if s is not None), default=None)


def paired_ratios(ours: Sequence[float], base: Sequence[float]) -> list[float | None]:
    """Repeat by repeat, ours / base: the two ran one after the other on the same schedules."""
    return [round(o / b, 3) if b > 0 else None for o, b in zip(ours, base)]
