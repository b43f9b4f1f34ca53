"""Fresh signals: a replica's pushed stats merged with what this router itself sent and saw finish.

Pushed stats (TargetReplica.record_routing_stats, deployments/replica_state.py) are exact but late: Serve's
controller polls them every `routing_stats_period_s` and broadcasts them, so they miss whatever was sent
since the snapshot and still count what finished since. The router's own ledger is immediate but partial:
it knows only its own requests (every ingress replica runs its own router). Together, per replica:

    load = the snapshot's running and queued  + what this router sent that the snapshot does not hold
                                                - what it saw finish that the snapshot still holds

with the KV pages and prefill tokens of those requests moved the same way. Which requests a snapshot
holds is exact, not guessed from clocks: a routed request runs in the engine under its route key
(deployments/running.py) and the snapshot lists the keys it runs. The snapshot's time (`ts`) only ages
the signals, taken as no later than the moment this router first saw it, so a replica whose clock runs
ahead cannot look fresher than it is; the policy ranks stale replicas after fresh ones.

A decided request counts at once, tentatively, so that a burst decided before Serve confirms any of it
spreads. Serve asks again for a request whose choices were all full when it tried them: that earlier
choice did not happen, so the request withdraws it before it is decided again (else every request
waiting in Serve's queue would hold a phantom slot, and under overload the replicas would look full
to each other's retries until the entries expired). Requests decided but never confirmed (cancelled
while waiting) leave the ledger after `tentative_ttl_s`: Serve confirms within a round trip.

Pure logic (no Ray, no I/O): times are arguments, and the caller serialises access.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from router.policy import Newcomer, ReplicaState, Sla, Speed, SpsTable, pages_for, tau


def fit_acceptance(recent_tau: float, mean_verified: float, prior: float) -> float:
    """The per-position survival alpha whose geometric law gives `recent_tau` at `mean_verified` drafts.

    tau(alpha, l) rises with alpha from 1 (alpha = 0) to 1 + l (alpha -> 1), so bisection finds it;
    a replica that verified no drafts yet tells nothing and gets the prior.
    """
    if mean_verified <= 0 or recent_tau <= 0:
        return prior
    if recent_tau >= 1 + mean_verified:
        return 0.999
    lo, hi = 0.0, 0.999
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if tau(mid, mean_verified) < recent_tau else (lo, mid)
    return (lo + hi) / 2


def speed_of(stats: Mapping, prior_acceptance: float) -> Speed | None:
    """A replica's Speed from its stats; None when they lack a cost table (no prediction possible)."""
    table = stats.get("sps_table")
    if not table:
        return None
    budget = stats.get("draft_budget") or {}
    window = stats.get("draft_window", 0)
    cap = window if budget.get("max_request_tokens") is None else min(window, budget["max_request_tokens"])
    by_class = {name: min(window, n) for name, n in (budget.get("max_request_tokens_by_class") or {}).items()}
    return Speed(
        sps=SpsTable(tuple(int(b) for b, _ in table), tuple(float(r) for _, r in table)),
        max_batch_tokens=int(stats.get("max_num_batched_tokens", table[-1][0])),
        acceptance=fit_acceptance(
            float(stats.get("recent_tau", 0.0)), float(stats.get("mean_verified", 0.0)), prior_acceptance
        ),
        draft_cap=cap,
        step_draft_cap=budget.get("max_step_tokens"),
        adaptive=bool(stats.get("adaptive_verify", False)),
        overhead=max(1.0, float(stats.get("step_overhead", 1.0))),
        class_caps=by_class,
    )


@dataclass
class Sent:
    """One request this router sent to a replica."""

    route_key: str  # its engine id's suffix: how a snapshot names it
    prompt_tokens: int
    max_tokens: int
    pages: int
    sla: Sla
    sent_at: float
    confirmed: bool = False  # Serve reported it accepted (on_request_routed)


@dataclass
class _Replica:
    live: dict[str, Sent] = field(default_factory=dict)
    done: deque[tuple[float, Sent]] = field(default_factory=deque)  # (finished at, request), in order


class Ledger:
    """What this router sent to each replica and saw finish, keyed by Serve's internal request id."""

    def __init__(self, tentative_ttl_s: float = 1.0) -> None:
        self.tentative_ttl_s = tentative_ttl_s
        self._replicas: dict[str, _Replica] = {}
        self._where: dict[str, str] = {}  # request key -> replica id

    def sent(self, replica_id: str, key: str, newcomer: Newcomer, page_size: int, now: float) -> None:
        """The router chose `replica_id` for the request (tentative until `routed`)."""
        self._drop(key)
        pages = pages_for(newcomer.prompt_tokens + newcomer.max_tokens, page_size)
        entry = Sent(newcomer.key, newcomer.prompt_tokens, newcomer.max_tokens, pages, newcomer.sla, now)
        self._replicas.setdefault(replica_id, _Replica()).live[key] = entry
        self._where[key] = replica_id

    def withdraw(self, key: str) -> None:
        """The request is being decided again: its tentative choice did not happen (a confirmed one
        stays: Serve placed it)."""
        replica_id = self._where.get(key)
        entry = self._replicas[replica_id].live.get(key) if replica_id is not None else None
        if entry is not None and not entry.confirmed:
            self._drop(key)

    def routed(self, replica_id: str, key: str, newcomer: Newcomer, page_size: int, now: float) -> None:
        """Serve placed the request on `replica_id` (maybe not the first choice: that one was full)."""
        if self._where.get(key) != replica_id:
            self.sent(replica_id, key, newcomer, page_size, now)
        self._replicas[replica_id].live[key].confirmed = True

    def completed(self, replica_id: str, key: str, now: float) -> None:
        replica = self._replicas.get(replica_id)
        entry = replica.live.pop(key, None) if replica else None
        if entry is None:
            return
        self._where.pop(key, None)
        replica.done.append((now, entry))

    def forget(self, replica_id: str) -> None:
        """The replica is gone: its requests ended with it."""
        replica = self._replicas.pop(replica_id, None)
        for key in replica.live if replica else ():
            self._where.pop(key, None)

    def in_flight(self, replica_id: str) -> int:
        replica = self._replicas.get(replica_id)
        return len(replica.live) if replica else 0

    def apply(
        self, state: ReplicaState, held: Collection[str], snapshot_at: float, now: float
    ) -> ReplicaState:
        """`state`, from a snapshot taken at `snapshot_at` that holds the route keys `held`, corrected by
        what this router sent that it does not hold and saw finish that it still holds."""
        replica = self._replicas.get(state.replica_id)
        if replica is None:
            return state
        self._expire(replica, now)
        # Finished, and a snapshot taken since no longer holds it: nothing left to correct.
        replica.done = deque((t, s) for t, s in replica.done if s.route_key in held or t > snapshot_at)
        added = [s for s in replica.live.values() if s.route_key not in held]
        gone = [s for _, s in replica.done if s.route_key in held]
        if not added and not gone:
            return state
        running = max(0, state.running - len(gone))
        queued = state.queued + len(added) - max(0, len(gone) - state.running)
        free_pages = state.free_pages - sum(s.pages for s in added) + sum(s.pages for s in gone)
        return ReplicaState(
            replica_id=state.replica_id,
            speed=state.speed,
            running=running,
            queued=max(0, queued),
            queued_prefill_tokens=state.queued_prefill_tokens + sum(s.prompt_tokens for s in added),
            free_pages=min(state.total_pages, free_pages) if state.speed is not None else state.free_pages,
            total_pages=state.total_pages,
            page_size=state.page_size,
            max_num_seqs=state.max_num_seqs,
            running_slas=tuple({*state.running_slas, *(s.sla for s in replica.live.values())}),
            remaining_tokens=tuple(sorted((*state.remaining_tokens, *(s.max_tokens for s in added)))),
            age_s=state.age_s,
            healthy=state.healthy,
            cached_prefix=state.cached_prefix,
        )

    def _drop(self, key: str) -> None:
        replica_id = self._where.pop(key, None)
        if replica_id is not None:
            self._replicas[replica_id].live.pop(key, None)

    def _expire(self, replica: _Replica, now: float) -> None:
        stale = [
            k for k, s in replica.live.items() if not s.confirmed and now - s.sent_at > self.tentative_ttl_s
        ]
        for key in stale:
            self._drop(key)


def replica_state(
    replica_id: str,
    stats: Mapping | None,
    speed: Speed | None,
    slas: Mapping[str, Sla],
    default: Sla,
    age_s: float,
) -> ReplicaState:
    """The state the stats describe (before the ledger's correction)."""
    if not stats:
        return ReplicaState(replica_id, None, healthy=True)
    by_class = stats.get("running_by_class") or {}
    page_size = int(stats.get("kv_page_size", 16))
    total_pages = int(stats.get("kv_total_pages", 0))
    free_pages = int(stats.get("kv_unreserved_pages", 0))
    if "kv_total_pages" not in stats and "kv_total_tokens" in stats:
        # A backend that reports its KV cache in tokens and a free fraction (SGLang): the same in pages.
        total_pages = int(stats["kv_total_tokens"]) // page_size
        free_pages = int(float(stats.get("kv_headroom", 0.0)) * total_pages)
    return ReplicaState(
        replica_id=replica_id,
        speed=speed,
        running=int(stats.get("running_requests", 0)),
        queued=int(stats.get("queued_requests", 0)),
        queued_prefill_tokens=int(stats.get("queued_prefill_tokens", 0)),
        free_pages=free_pages,
        total_pages=total_pages,
        page_size=page_size,
        max_num_seqs=int(stats.get("max_num_seqs", 1)),
        running_slas=tuple({slas.get(name, default) for name in by_class}),
        remaining_tokens=tuple(sorted(int(n) for n in stats.get("remaining_tokens", ()))),
        age_s=age_s if math.isfinite(age_s) else math.inf,
        healthy=bool(stats.get("healthy", True)),
    )
