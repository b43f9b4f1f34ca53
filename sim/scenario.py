"""A simulation run from plain settings: the fleet, the workload at a load relative to capacity, the arm.

Capacity is the fleet's plain-decoding saturation rate for the workload's mean request: with n requests
decoding and prompts prefilled at the rate they arrive, a step runs B = n (1 + prompt / output) tokens,
so a replica finishes n / (output x step(B)) requests per second; capacity takes the best n allowed by
max_num_seqs and the step's token budget. Load 0.8 offers 80% of it. Speculation raises a replica's
real capacity above this (that is its point); the reference is the same for every arm.
"""

from __future__ import annotations

import contextlib
import gc
import math
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace

from router.policy import Sla
from sim.cluster import Cluster, ClusterConfig, Failure, Group
from sim.control import ControllerArm
from sim.metrics import summarize
from sim.profiles import Profile, load
from sim.workload import Workload, generate

# SLA classes per profile: what that hardware class would be sold at (the CPU ones are the app's defaults,
# router/sla.py's DEFAULT_CLASSES).
CLASSES: dict[str, dict[str, Sla]] = {
    "cpu_measured": {
        "interactive": Sla("interactive", 1.0, 0.100, 0, True),
        "standard": Sla("standard", 5.0, 0.250, 1, False),
        "batch": Sla("batch", 60.0, 2.0, 2, False),
    },
    "gpu_dsv4flash_rocm": {
        "interactive": Sla("interactive", 1.0, 0.025, 0, True),
        "standard": Sla("standard", 3.0, 0.050, 1, False),
        "batch": Sla("batch", 30.0, 0.200, 2, False),
    },
}
# Budget arms: the engine's scheduler mode and whether it drafts; "controller" is the engine's scheduler
# under controller/'s caps (sim/control.py).
SCHEDULERS = {
    "fixed": ("fixed", True),
    "engine": ("dspark", True),
    "controller": ("dspark", True),
    "plain": ("plain", False),
}


@dataclass(frozen=True)
class Scenario:
    profile: str = "gpu_dsv4flash_rocm"
    replicas: int = 10
    router: str = "sla"  # pow2 | round_robin | sla
    scheduler: str = "engine"  # fixed (block of gamma every round) | engine (DSpark scheduler) | plain
    load: float = 0.8
    duration_s: float = 60.0
    warmup_s: float = 10.0
    drain_s: float = 60.0
    pattern: str = "poisson"
    seed: int = 0
    slow_share: float = 0.0  # share of replicas that run `slow_factor` times slower
    slow_factor: float = 2.0
    hetero: bool = False  # half the fleet a 2x faster class (a larger TP group)
    failures: int = 0  # replica failures spread over the run
    candidates: int = 8
    calibrate_tpot: bool = False  # the SLA arm calibrates its TPOT (router/policy.py PolicyConfig)
    stats_period_s: float = 0.25
    workload: Mapping = field(default_factory=dict)  # overrides of Workload fields
    draft_gate: bool = True
    # The engines' step token budget (chunked prefill), when not the profile's. Load stays relative to
    # the profile's own capacity, so the same load offers the same traffic whatever the budget.
    max_num_batched_tokens: int | None = None

    def build(self) -> tuple[ClusterConfig, Workload, float]:
        base = load(self.profile)
        groups = self._fleet(base)
        served = groups
        if self.max_num_batched_tokens is not None:
            budget = self.max_num_batched_tokens
            served = self._fleet(
                replace(base, name=f"{base.name}-M{budget}", max_num_batched_tokens=budget, cache={})
            )
        classes = CLASSES.get(self.profile, CLASSES["gpu_dsv4flash_rocm"])
        shape = Workload(
            rate=1.0, duration_s=self.duration_s, pattern=self.pattern, seed=self.seed, **self.workload
        )
        if not set(shape.domains) <= set(base.acceptance):
            shape = Workload(**{**shape.__dict__, "domains": {d: 1.0 for d in base.acceptance}})
        capacity = sum(g.count * replica_capacity(g.profile, shape) / g.slow for g in groups)
        workload = Workload(**{**shape.__dict__, "rate": self.load * capacity})
        failures = tuple(
            Failure(self.duration_s * (k + 1) / (self.failures + 1), k * 7919, 30.0)
            for k in range(self.failures)
        )
        config = ClusterConfig(
            fleet=served,
            classes=classes,
            default_class="standard",
            router=self.router,
            stats_period_s=self.stats_period_s,
            candidates=self.candidates,
            calibrate_tpot=self.calibrate_tpot,
            failures=failures,
            seed=self.seed,
            controller=ControllerArm(classes) if self.scheduler == "controller" else None,
        )
        return config, workload, capacity

    def _fleet(self, base: Profile) -> list[Group]:
        scheduler, drafting = SCHEDULERS[self.scheduler]
        n = self.replicas
        slow = round(n * self.slow_share)
        fast = n // 2 if self.hetero else 0
        groups = []
        if fast:
            groups.append(
                Group(base.scaled(2.0, f"{base.name}-tp2"), fast, scheduler, drafting, 1.0, self.draft_gate)
            )
        normal = n - fast - slow
        if normal > 0:
            groups.append(Group(base, normal, scheduler, drafting, 1.0, self.draft_gate))
        if slow:
            groups.append(
                Group(base, slow, scheduler, drafting, self.slow_factor, self.draft_gate, f"{base.name}-slow")
            )
        return groups


def replica_capacity(profile: Profile, w: Workload) -> float:
    """Plain-decoding saturation rate (requests/s) of one replica for the workload's mean request."""
    prompt = (
        w.prompt_median
        * math.exp(w.prompt_sigma**2 / 2)
        * (1 + w.long_prompt_share * (w.long_prompt_factor - 1))
    )
    output = w.output_median * math.exp(w.output_sigma**2 / 2)
    table = profile.cost_table()
    best = 0.0
    for n in range(1, profile.max_num_seqs + 1):
        tokens = math.ceil(n * (1 + prompt / output))
        if tokens > profile.max_num_batched_tokens:
            break
        best = max(best, n / (output * profile.step_seconds(tokens, n, 0, table)))
    return best


def run(scenario: Scenario, tick: Callable[[float], None] | None = None) -> dict:
    """Simulate one scenario; returns its settings, summary metrics, timeline and cost."""
    config, workload, capacity = scenario.build()
    requests = generate(workload)
    cluster = Cluster(config, requests)
    start, cpu = time.perf_counter(), time.process_time()
    with few_collections():
        cluster.run(scenario.duration_s + scenario.drain_s, tick)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    summary = summarize(requests, config.classes, scenario.warmup_s, scenario.duration_s)
    result = {
        "scenario": {**scenario.__dict__, "workload": dict(scenario.workload)},
        "capacity_rps": round(capacity, 4),
        "offered_rps": round(workload.rate, 4),
        "summary": summary,
        "wall_s": round(wall, 3),
        "cpu_s": round(cpu, 3),  # this process's CPU: what the run costs, alike on a busy machine
        "events": cluster.q.processed,
        "timeline": cluster.timeline.__dict__,
        **rounds_work(cluster),
    }
    for name, times in (("", "decision_s"), ("_cpu", "decision_cpu_s")):
        ordered = sorted(getattr(cluster.router, times, None) or ())
        if ordered:
            result[f"decision{name}_p50_ms"] = round(1e3 * ordered[len(ordered) // 2], 4)
            result[f"decision{name}_p99_ms"] = round(
                1e3 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 4
            )
    result["cluster"] = cluster
    return result


@contextlib.contextmanager
def few_collections() -> Iterator[None]:
    """Python's cyclic collector, out of the way of a run: the workload and the fleet are frozen (a full
    collection would walk every request of the trace again and again), and young objects are collected
    in larger batches. A router's decision timed inside the run still pays for any collection it
    triggers, but not for a pass over the whole simulated trace, which a real router's heap does not hold.
    """
    gc.collect()
    gc.freeze()
    threshold = gc.get_threshold()
    gc.set_threshold(20_000, 50, 50)
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        gc.unfreeze()


def rounds_work(cluster: Cluster) -> dict[str, float]:
    """What speculation did over the run, per request-round (one request's share of a step): drafts the
    target verified, drafts it accepted, and their ratio. A method's gain is credited only beside these."""
    reps = cluster.all_replicas()
    rounds = sum(r.counters.rounds for r in reps)
    drafted = sum(r.counters.drafted_tokens for r in reps)
    accepted = sum(r.counters.accepted_tokens for r in reps)
    return {
        "verify_per_round": round(drafted / rounds, 4) if rounds else 0.0,
        "accepted_per_round": round(accepted / rounds, 4) if rounds else 0.0,
        "accepted_share": round(accepted / drafted, 4) if drafted else 0.0,
    }
