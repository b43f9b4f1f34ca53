"""What a simulated replica publishes for the router: deployments/replica_state.py's snapshot, key for key.

The real replica builds it from its Engine; here it comes from the SimReplica's state and counters, with
the recent-rounds rates computed by the real deployments.replica_state.RecentRounds (among them the
measured wall time of a decode step per round, from the simulated steps' own times, which the router
calibrates its TPOT by) and the recent forward rate by its RecentForwards (which the router scales the
replica's table by). Times are wall times on the replica's host, as the engine measures them: a forward
stretched by the host's contention runs at a lower rate, and the step over the forward keeps only the
engine's own overhead.
"""

from __future__ import annotations

from collections import Counter

from deployments.replica_state import COUNTERS, MAX_REMAINING_REPORTED, RecentForwards, RecentRounds
from dspark.verify_policy import SCHEDULED_MODES
from sim.replica import SimReplica


def snapshot(
    replica: SimReplica, recent: RecentRounds, now: float, forwards: RecentForwards | None = None
) -> dict:
    seqs = list(replica.seqs.values())
    queued = [s for s in seqs if not s.decoding]
    c = replica.counters
    pages = replica.pages
    unreserved = pages.num_unreserved_pages  # a sum over the running requests: once
    return {
        "ts": now,
        "running_requests": len(seqs) - len(queued),
        "queued_requests": len(queued),
        "queued_prefill_tokens": sum(s.req.prompt_tokens - s.computed for s in queued),
        "kv_unreserved_pages": unreserved,
        "kv_total_pages": pages.num_pages,
        "kv_headroom": unreserved / pages.num_pages,
        "kv_page_size": pages.page_size,
        "max_num_seqs": replica.profile.max_num_seqs,
        "max_num_batched_tokens": replica.profile.max_num_batched_tokens,
        "remaining_tokens": sorted(s.remaining for s in seqs)[:MAX_REMAINING_REPORTED],
        "running_by_class": dict(Counter(s.req.sla_class for s in seqs)),
        "running_keys": [s.key for s in seqs],
        "finished_requests": c.finished_requests,
        "aborted_requests": 0,
        **{name: getattr(c, name) for name in COUNTERS},
        **recent.update(
            c.rounds,
            c.accepted_tokens,
            c.drafted_tokens,
            c.step_time_s,
            c.forward_wall_s,
            c.round_time_s,
            c.round_tokens,
            now,
        ),
        **(forwards.update(c.steps, c.forward_tokens, c.forward_wall_s) if forwards is not None else {}),
        "draft_window": replica.gamma,
        "adaptive_verify": replica.scheduler in SCHEDULED_MODES,
        "draft_budget": replica.budget.to_dict(),
        "sps_table": replica.published_table,
        "healthy": replica.alive,
        # deployments/replica_state.prefix_cache: the cached pages' names the router matches prompts to.
        "prefix_cache": {
            **replica.pages.routing_summary(),
            "prompt_tokens": c.prompt_tokens,
            "cached_prompt_tokens": c.cached_prompt_tokens,
        },
    }
