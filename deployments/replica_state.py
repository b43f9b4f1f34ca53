"""A target replica's state as data: the load it publishes for the router, and its draft budget.

Pure functions of an Engine, no Ray. They run on the engine thread between steps (AsyncEngine.call),
so they see a consistent engine; `RecentRounds` turns cumulative counters into recent rates.

What the SLA router (router/policy.py) reads from a snapshot: the load (running and queued requests,
queued prefill tokens, KV pages, max_num_seqs, tokens each request has left, and the route keys of the
requests it holds), the speed (the SPS table, the step's token budget, the draft window and budget,
whether verify lengths adapt to the table, and over the recent rounds tau, the drafts verified per
round, step time / forward time and the wall time a decoding request waited per round), the SLA
classes running, and `ts`, when the snapshot was taken
(the router ages signals by it). With prefix caching the snapshot names the cached prompt pages, so a
router can predict the prefill a prompt would skip on each replica (`prefix_cache`).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass

from deployments.running import route_key
from dspark import cost_table
from dspark.draft_budget import DraftBudget
from dspark.engine import Engine
from dspark.sequence import Status
from dspark.verify_policy import SCHEDULED_MODES

MAX_REMAINING_REPORTED = 64  # the router's retry hint needs the soonest finishers, not all of them
COUNTERS = (
    "rounds",
    "accepted_tokens",
    "drafted_tokens",
    "step_time_s",
    "forward_time_s",
    "round_time_s",
    "round_tokens",
)
FORWARD_COUNTERS = ("steps", "forward_tokens", "forward_time_s")  # RecentForwards reads these


@dataclass
class RecentRounds:
    """Over the steps since the previous reading: tau (tokens gained per verify round), the drafts
    verified per round, and how much longer a step takes than its target forward (drafting, the
    engine's own work). An idle window keeps the last values: the router wants the replica's
    numbers, not zeros.

    And the decode steps as their requests lived them (EngineStats.round_time_s): the mean wall time
    of a step per round, the mean decode tokens of those steps, and `ts` of the reading that measured
    them. A request's time per output token is that wall over tau, whatever made the steps slow: the
    prefill chunks they carried, drafting, the serving loop between steps, other work on the machine.
    The router sets it against its own model of such a step (router/signals.py decode_calibration).
    That window closes only once it holds `min_rounds` rounds (a few rounds are one odd step's
    noise) and keeps its last values while idle."""

    min_rounds: int = 32
    half_life_s: float = 2.0  # the decode measurement's smoothing
    rounds: int = 0
    accepted: int = 0
    drafted: int = 0
    step_time_s: float = 0.0
    forward_time_s: float = 0.0
    tau: float = 0.0
    mean_verified: float = 0.0
    overhead: float = 1.0
    # The decode window: counters at its start, and what the last closed one measured.
    window_rounds: int = 0
    window_time_s: float = 0.0
    window_tokens: int = 0
    round_s: float = 0.0
    round_tokens: float = 0.0
    round_ts: float | None = None  # the reading that measured them; None: none yet

    def update(
        self,
        rounds: int,
        accepted_tokens: int,
        drafted_tokens: int,
        step_time_s: float,
        forward_time_s: float,
        round_time_s: float = 0.0,
        round_tokens: int = 0,
        now: float | None = None,
    ) -> dict:
        d_rounds, d_accepted = rounds - self.rounds, accepted_tokens - self.accepted
        d_drafted = drafted_tokens - self.drafted
        d_step, d_forward = step_time_s - self.step_time_s, forward_time_s - self.forward_time_s
        if d_rounds > 0:
            self.tau = (d_accepted + d_rounds) / d_rounds
            self.mean_verified = d_drafted / d_rounds
        if d_forward > 0:
            self.overhead = max(1.0, d_step / d_forward)
        self.rounds, self.accepted, self.drafted = rounds, accepted_tokens, drafted_tokens
        self.step_time_s, self.forward_time_s = step_time_s, forward_time_s
        out = {
            "recent_tau": round(self.tau, 4),
            "mean_verified": round(self.mean_verified, 4),
            "step_overhead": round(self.overhead, 4),
        }
        return out | self._decode_window(rounds, round_time_s, round_tokens, now)

    def _decode_window(self, rounds: int, round_time_s: float, round_tokens: int, now: float | None) -> dict:
        d_rounds = rounds - self.window_rounds
        if now is not None and d_rounds >= self.min_rounds and round_time_s > self.window_time_s:
            seconds = (round_time_s - self.window_time_s) / d_rounds
            tokens = (round_tokens - self.window_tokens) / d_rounds
            if self.round_ts is None:
                self.round_s, self.round_tokens = seconds, tokens
            else:  # smoothed over a few seconds: a window of a busy replica may be a single step
                weight = 1.0 - 0.5 ** ((now - self.round_ts) / self.half_life_s)
                self.round_s += weight * (seconds - self.round_s)
                self.round_tokens += weight * (tokens - self.round_tokens)
            self.round_ts = now
            self.window_rounds, self.window_time_s, self.window_tokens = rounds, round_time_s, round_tokens
        if self.round_ts is None:
            return {}
        return {
            "recent_round_s": round(self.round_s, 6),
            "recent_round_tokens": round(self.round_tokens, 2),
            "recent_round_ts": self.round_ts,
        }


@dataclass
class RecentForwards:
    """Over the steps since the previous reading: the mean tokens per target forward and the forwards
    per second of forward time. The router scales the replica's SPS table by how this measured rate
    compares with the table's at that size (router/signals.py): a table profiled at start, coarsely or
    on a machine then less busy, drifts from what the forwards cost now. A reading covers at least
    `min_steps` forwards (fewer are one odd step's noise: the window then stays open); idle: the last
    values."""

    min_steps: int = 8
    steps: int = 0
    forward_tokens: int = 0
    forward_time_s: float = 0.0
    tokens: float = 0.0
    sps: float = 0.0

    def update(self, steps: int, forward_tokens: int, forward_time_s: float) -> dict:
        d_steps, d_tokens = steps - self.steps, forward_tokens - self.forward_tokens
        d_time = forward_time_s - self.forward_time_s
        if d_steps >= self.min_steps and d_time > 0:
            self.tokens, self.sps = d_tokens / d_steps, d_steps / d_time
            self.steps, self.forward_tokens, self.forward_time_s = steps, forward_tokens, forward_time_s
        if not self.sps:
            return {}
        return {"recent_forward_tokens": round(self.tokens, 2), "recent_forward_sps": round(self.sps, 3)}


@dataclass
class TauWindow:
    """tau over the rounds since the previous reading, for a backend that counts only rounds and
    accepted tokens (deployments/sglang_replica.py); RecentRounds is the built-in engine's fuller view."""

    rounds: int = 0
    accepted: int = 0
    tau: float = 0.0

    def update(self, rounds: int, accepted: int) -> float:
        d_rounds, d_accepted = rounds - self.rounds, accepted - self.accepted
        if d_rounds > 0:  # an idle window keeps the last value: the router wants the replica's tau, not 0
            self.tau = (d_accepted + d_rounds) / d_rounds
        self.rounds, self.accepted = rounds, accepted
        return self.tau


@dataclass
class Republisher:
    """Serve's controller pulls a replica's routing stats every `routing_stats_period_s` and sends them
    on to every handle (each ingress' router, each proxy) whenever they differ from the last reading.
    A reading of an unchanged replica differs only by its time, yet costs every ingress a broadcast to
    receive. So an unchanged reading is published again as the previous one (no broadcast), until
    that one is `max_age_s` old: a router then still sees it younger than it ranks as stale
    (router/policy.py stale_after_s, at least 1 s) and the cluster controller's readings stay as
    fresh. A changed reading goes out at once."""

    max_age_s: float = 0.4
    last: dict | None = None

    def publish(self, reading: dict) -> dict:
        last = self.last
        if last is not None and reading["ts"] - last["ts"] < self.max_age_s and _same(reading, last):
            return last
        self.last = reading
        return reading


def _same(reading: dict, last: dict) -> bool:
    return len(reading) == len(last) and all(k == "ts" or last.get(k) == v for k, v in reading.items())


def draft_budget(engine: Engine) -> dict:
    """The draft budget in force (dspark.draft_budget.DraftBudget) as JSON-ready data."""
    budget = getattr(engine, "draft_budget", None)
    if budget is None:  # an engine without the scheduler's budget: its fixed window is the budget
        return {
            "max_step_tokens": None,
            "max_request_tokens": engine.gamma,
            "max_request_tokens_by_class": {},
        }
    return budget.to_dict()


def routing_cost_table(engine: Engine) -> cost_table.CostTable:
    """SPS(B) for the router: the engine's own table, or one profiled (or read from the cache) for an
    engine that schedules without one (no drafter, a fixed window). Only while no request runs."""
    if engine.cost_table is not None:
        return engine.cost_table
    config = engine.config
    return cost_table.load_or_profile(
        engine.runner, config.model, engine.cost_table_shape(), config.cost_table_dir
    )


def prefix_cache(engine: Engine) -> dict:
    """The prefix cache as the router sees it: the short hashes of cached pages at the start of
    prompts, from which `dspark.prefix_cache.cached_prefix_tokens(prompt_token_ids, summary)` predicts
    the prefill a prompt would skip here, and the prompt tokens served from the cache so far."""
    stats = engine.stats
    return {
        **engine.pages.routing_summary(),
        "prompt_tokens": stats.prompt_tokens,
        "cached_prompt_tokens": stats.cached_prompt_tokens,
    }


def snapshot(engine: Engine, routing_table: cost_table.CostTable | None = None) -> dict:
    seqs = list(engine.seqs.values())
    queued = [s for s in seqs if s.status is Status.PREFILL]
    stats = engine.stats
    table = engine.cost_table or routing_table
    return {
        "ts": time.time(),
        "running_requests": len(seqs) - len(queued),
        "queued_requests": len(queued),
        "queued_prefill_tokens": sum(len(s.prompt_token_ids) - s.num_computed for s in queued),
        "kv_unreserved_pages": engine.pages.num_unreserved_pages,
        "kv_total_pages": engine.pages.num_pages,
        "kv_headroom": engine.pages.num_unreserved_pages / engine.pages.num_pages,
        "kv_page_size": engine.pages.page_size,
        "max_num_seqs": engine.config.max_num_seqs,
        "max_num_batched_tokens": engine.config.max_num_batched_tokens,
        "remaining_tokens": sorted(s.remaining_tokens for s in seqs)[:MAX_REMAINING_REPORTED],
        "running_by_class": dict(Counter(s.params.sla_class or "" for s in seqs)),
        "running_keys": [route_key(s.request_id) for s in seqs],
        "finished_requests": stats.finished_requests,
        "aborted_requests": stats.aborted_requests,
        **{name: getattr(stats, name) for name in COUNTERS},
        "draft_window": engine.gamma,
        "adaptive_verify": engine.cost_table is not None and engine.config.scheduler in SCHEDULED_MODES,
        "draft_budget": draft_budget(engine),
        "sps_table": None
        if table is None
        else [[b, round(r, 3)] for b, r in zip(table.points, table.smoothed)],
        "prefix_cache": prefix_cache(engine),
    }


def routing_snapshot(engine: Engine, routing_table: cost_table.CostTable | None = None) -> dict:
    """`snapshot` plus the raw counters RecentForwards turns into the recent forward rate (the
    replica publishes the rate, not these)."""
    return {
        **snapshot(engine, routing_table),
        **{name: getattr(engine.stats, name) for name in FORWARD_COUNTERS},
    }


def set_draft_budget(engine: Engine, budget: dict) -> dict:
    """Replace the budget while requests run (next step obeys it); returns the budget now in force."""
    engine.set_draft_budget(DraftBudget.from_dict(budget))
    return draft_budget(engine)
