"""A target replica's state as data: the load it publishes for the router, and its draft budget.

Pure functions of an Engine, no Ray. They run on the engine thread between steps (AsyncEngine.call),
so they see a consistent engine; `TauWindow` turns cumulative counters into the recent τ. With prefix
caching the snapshot names the cached prompt pages, so a router can predict the prefill a prompt
would skip on each replica (`prefix_cache`).
"""

from __future__ import annotations

from dataclasses import dataclass

from dspark.draft_budget import DraftBudget
from dspark.engine import Engine
from dspark.sequence import Status


@dataclass
class TauWindow:
    """τ (tokens gained per verify round) over the rounds since the previous reading."""

    rounds: int = 0
    accepted: int = 0
    tau: float = 0.0

    def update(self, rounds: int, accepted: int) -> float:
        d_rounds, d_accepted = rounds - self.rounds, accepted - self.accepted
        if d_rounds > 0:  # an idle window keeps the last value: the router wants the replica's τ, not 0
            self.tau = (d_accepted + d_rounds) / d_rounds
        self.rounds, self.accepted = rounds, accepted
        return self.tau


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


def sps_table(engine: Engine) -> list[list[float]] | None:
    """The engine's cost table as [[batch_tokens, verify_steps_per_s], ...] at its profiled points."""
    table = getattr(engine, "cost_table", None)
    if table is None:
        return None
    return [[b, round(r, 3)] for b, r in zip(table.points, table.smoothed)]


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


def snapshot(engine: Engine) -> dict:
    seqs = list(engine.seqs.values())
    queued = [s for s in seqs if s.status is Status.PREFILL]
    return {
        "running_requests": len(seqs) - len(queued),
        "queued_requests": len(queued),
        "queued_prefill_tokens": sum(len(s.prompt_token_ids) - s.num_computed for s in queued),
        "kv_unreserved_pages": engine.pages.num_unreserved_pages,
        "kv_total_pages": engine.pages.num_pages,
        "kv_headroom": engine.pages.num_unreserved_pages / engine.pages.num_pages,
        "max_num_seqs": engine.config.max_num_seqs,
        "finished_requests": engine.stats.finished_requests,
        "aborted_requests": engine.stats.aborted_requests,
        "rounds": engine.stats.rounds,
        "accepted_tokens": engine.stats.accepted_tokens,
        "draft_budget": draft_budget(engine),
        "sps_table": sps_table(engine),
        "prefix_cache": prefix_cache(engine),
    }


def set_draft_budget(engine: Engine, budget: dict) -> dict:
    """Replace the budget while requests run (next step obeys it); returns the budget now in force."""
    engine.set_draft_budget(DraftBudget.from_dict(budget))
    return draft_budget(engine)
