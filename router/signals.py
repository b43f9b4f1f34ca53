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

import bisect
import heapq
import math
from collections.abc import Collection, Container, Mapping
from dataclasses import dataclass, field, replace

from router.policy import Newcomer, ReplicaState, Sla, pages_for
from router.speed import Speed, SpsTable


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
        # tau(mid, mean_verified), inlined (mid < 1): this runs for every new stats version a decision reads.
        if 1.0 + mid * (1.0 - mid**mean_verified) / (1.0 - mid) < recent_tau:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


MIN_SPS_SCALE, MAX_SPS_SCALE = 0.25, 4.0  # a measurement further off than this is not trusted


def sps_scale(table: SpsTable, stats: Mapping) -> float:
    """How fast the replica's forwards run now against its table: the measured forwards per second at
    the recent mean forward size over the table's rate there (1 until the replica has measured any).

    The table was profiled at start (coarsely, maybe while other replicas profiled beside it); what a
    forward costs now also depends on everything else the machine runs. Left alone, every TPOT and TTFT
    the router predicts inherits that drift: targets look met that are not, and shedding comes late."""
    tokens, measured = (
        float(stats.get("recent_forward_tokens", 0.0)),
        float(stats.get("recent_forward_sps", 0.0)),
    )
    if tokens <= 0 or measured <= 0:
        return 1.0
    return min(MAX_SPS_SCALE, max(MIN_SPS_SCALE, measured / table(tokens)))


MIN_CALIBRATION, MAX_CALIBRATION = 0.25, 4.0  # a measured decode step further off is not trusted
CALIBRATION_MAX_AGE_S = 60.0  # a measurement older than this (a replica idle since) is not used


def decode_calibration(sps: SpsTable, overhead: float, stats: Mapping) -> float:
    """The measured wall time of the replica's recent decode steps over what the model (its table
    `sps`, as scaled, stretched by `overhead`: policy.step_time) predicts for a step of their decode
    tokens (1 when none was measured, or not within CALIBRATION_MAX_AGE_S of the
    stats' own time).

    The model prices a decode step from the cost table: its decode tokens' forward, stretched by the
    measured step / forward time. The requests also wait for what it leaves out: the prefill chunks
    their steps carry, the serving loop between steps, other replicas and threads on the same cores.
    The replica measures the wall time its decoding requests waited per round
    (deployments/replica_state.py RecentRounds); the ratio carries that into every TPOT the policy
    predicts for it, at the load and contention it runs under now."""
    measured = float(stats.get("recent_round_s", 0.0))
    tokens = float(stats.get("recent_round_tokens", 0.0))
    at = stats.get("recent_round_ts")
    if measured <= 0 or tokens <= 0 or at is None:
        return 1.0
    if float(stats.get("ts", at)) - float(at) > CALIBRATION_MAX_AGE_S:
        return 1.0
    return min(MAX_CALIBRATION, max(MIN_CALIBRATION, measured * sps(tokens) / overhead))


def speed_of(stats: Mapping, prior_acceptance: float, calibrate: bool = True) -> Speed | None:
    """A replica's Speed from its stats; None when they lack a cost table (no prediction possible).
    The table is scaled to the forward rate the replica measured recently (`sps_scale`), and with
    `calibrate` decode steps to their measured wall time (`decode_calibration`)."""
    table = stats.get("sps_table")
    if not table:
        return None
    points, rates = zip(*table)
    sps = SpsTable(tuple(map(int, points)), tuple(map(float, rates)))
    scale = sps_scale(sps, stats)
    if scale != 1.0:
        sps = SpsTable(sps.points, tuple(r * scale for r in sps.rates))
    budget = stats.get("draft_budget") or {}
    window = stats.get("draft_window", 0)
    cap = window if budget.get("max_request_tokens") is None else min(window, budget["max_request_tokens"])
    by_class = {name: min(window, n) for name, n in (budget.get("max_request_tokens_by_class") or {}).items()}
    overhead = max(1.0, float(stats.get("step_overhead", 1.0)))
    return Speed(
        sps=sps,
        max_batch_tokens=int(stats.get("max_num_batched_tokens", table[-1][0])),
        acceptance=fit_acceptance(
            float(stats.get("recent_tau", 0.0)), float(stats.get("mean_verified", 0.0)), prior_acceptance
        ),
        draft_cap=cap,
        step_draft_cap=budget.get("max_step_tokens"),
        adaptive=bool(stats.get("adaptive_verify", False)),
        overhead=overhead,
        calibration=decode_calibration(sps, overhead, stats) if calibrate else 1.0,
        class_caps=by_class,
    )


def smooth_speed(previous: Speed | None, current: Speed, seconds: float, half_life_s: float) -> Speed:
    """`current`'s measured parts (the acceptance, the table's rates as scaled to the measured forward
    rate, the step overhead, the decode calibration) smoothed exponentially over `half_life_s`: `previous`
    (the last smoothed speed) moved toward `current` by 1 - 0.5 ** (seconds / half_life_s), `seconds`
    between the two readings; `current` when there is no previous, no half-life, or the two cannot be
    blended (another table's points, no time between them).

    One reading covers a stats period, a few steps: its tau swings with which requests happened to run
    (1.0 to 4.4 seen on one replica within seconds), and its forward rate with what else the machine ran
    in those steps. The policy reads that noise as speed: of two equal replicas, the one that looked
    faster last takes the next requests though it is not faster, and its batch grows. A replica's speed
    changes over seconds (its drafter, its batch's prompts, the machine's load), not from one step to
    the next, so a second's memory keeps what is real and drops most of the noise."""
    if previous is None or seconds <= 0 or half_life_s <= 0 or previous.sps.points != current.sps.points:
        return current
    keep = 0.5 ** (seconds / half_life_s)

    def blend(old: float, new: float) -> float:
        return keep * old + (1.0 - keep) * new

    rates = tuple([keep * a + (1.0 - keep) * b for a, b in zip(previous.sps.rates, current.sps.rates)])
    return replace(
        current,
        sps=SpsTable(current.sps.points, rates),
        acceptance=blend(previous.acceptance, current.acceptance),
        overhead=blend(previous.overhead, current.overhead),
        calibration=blend(previous.calibration, current.calibration),
    )


PREFILL_RATE_HALF_LIFE_S = 2.0  # a few seconds of arrivals: one stats period holds only a few prompts


def prompt_tokens_admitted(stats: Mapping) -> int | None:
    """The replica's cumulative prompt tokens admitted (its prefix-cache summary counts them), or None."""
    count = (stats.get("prefix_cache") or {}).get("prompt_tokens")
    return None if count is None else int(count)


def prefill_rate(previous: float | None, tokens: int, seconds: float) -> float:
    """The prompt tokens per second reaching a replica, from `tokens` admitted over the `seconds` between
    two of its snapshots, smoothed with the previous estimate (None: this is the first) over
    PREFILL_RATE_HALF_LIFE_S: a stats period holds a few prompts, too few to predict the next ones by."""
    measured = tokens / seconds
    if previous is None:
        return measured
    weight = 1.0 - 0.5 ** (seconds / PREFILL_RATE_HALF_LIFE_S)
    return previous + weight * (measured - previous)


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
    """One replica's ledger, with the corrections for the snapshot it was last applied to kept as running
    totals: `apply` runs on every candidate of every decision, so it must not scan the requests in flight.

    The totals are relative to a view, the (held keys, snapshot time) of that snapshot: which live
    requests it does not hold ("added") and which finished ones it still holds ("gone"). Sends, drops and
    completions update them as they happen; a new snapshot rebuilds them once (amortised over the
    decisions until the next one, a stats period later).
    """

    live: dict[str, Sent] = field(default_factory=dict)
    done: list[tuple[float, Sent]] = field(default_factory=list)  # finished, kept under the view
    pending: list[tuple[float, Sent]] = field(default_factory=list)  # finished since, not yet sorted out
    tentative: list[tuple[float, int, str, Sent]] = field(default_factory=list)  # heap by sent time
    slas: dict[Sla, int] = field(default_factory=dict)  # live requests per class
    # The view and the totals under it (held is None: no view yet).
    held: Collection[str] | None = None
    snapshot_at: float = -math.inf
    added: int = 0
    added_pages: int = 0
    added_prompt_tokens: int = 0
    added_max_tokens: list[int] = field(default_factory=list)  # ascending
    gone: int = 0
    gone_pages: int = 0
    # Merged tuples for the last base state seen, and the last corrected state, valid while neither side
    # changes.
    version: int = 0  # bumped when any total, added_max_tokens or slas change
    remaining_memo: tuple = (None, -1, ())  # (base remaining_tokens, version, merged)
    slas_memo: tuple = (None, -1, ())  # (base running_slas, version, merged)
    applied: tuple = (None, -1, None, None)  # (base state, version, cached_prefix, corrected)

    def enter(self, key: str, entry: Sent) -> None:
        self.live[key] = entry
        self.slas[entry.sla] = self.slas.get(entry.sla, 0) + 1
        if not entry.confirmed:
            heapq.heappush(self.tentative, (entry.sent_at, id(entry), key, entry))
        if self.held is not None and entry.route_key not in self.held:
            self._count_added(entry, +1)
        self.version += 1

    def leave(self, key: str) -> Sent | None:
        entry = self.live.pop(key, None)
        if entry is None:
            return None
        count = self.slas[entry.sla] - 1
        if count:
            self.slas[entry.sla] = count
        else:
            del self.slas[entry.sla]
        if self.held is not None and entry.route_key not in self.held:
            self._count_added(entry, -1)
        self.version += 1
        return entry

    def _count_added(self, entry: Sent, sign: int) -> None:
        self.added += sign
        self.added_pages += sign * entry.pages
        self.added_prompt_tokens += sign * entry.prompt_tokens
        if sign > 0:
            bisect.insort(self.added_max_tokens, entry.max_tokens)
        else:
            del self.added_max_tokens[bisect.bisect_left(self.added_max_tokens, entry.max_tokens)]

    def view(self, held: Collection[str], snapshot_at: float) -> None:
        """Bring the totals to the snapshot (`held`, `snapshot_at`): rebuilt if it is a new one."""
        new = held is not self.held and held != self.held  # (`held` is never changed in place)
        if self.held is None or snapshot_at != self.snapshot_at or new:
            self.held, self.snapshot_at = held, snapshot_at
            self.pending = self.done + self.pending
            self.done, self.gone, self.gone_pages = [], 0, 0
            self.added, self.added_pages, self.added_prompt_tokens, self.added_max_tokens = 0, 0, 0, []
            for entry in self.live.values():
                if entry.route_key not in held:
                    self._count_added(entry, +1)
            self.version += 1
        # Finished, and a snapshot taken since no longer holds it: nothing left to correct.
        for t, entry in self.pending:
            if entry.route_key in held:
                self.done.append((t, entry))
                self.gone += 1
                self.gone_pages += entry.pages
                self.version += 1
            elif t > snapshot_at:
                self.done.append((t, entry))
        self.pending = []

    def merged(self, state: ReplicaState) -> tuple[tuple[int, ...], tuple[Sla, ...]]:
        """The state's tokens left and classes running, with this router's requests added."""
        base, version, remaining = self.remaining_memo
        if base is not state.remaining_tokens or version != self.version:
            remaining = tuple(sorted((*state.remaining_tokens, *self.added_max_tokens)))
            self.remaining_memo = (state.remaining_tokens, self.version, remaining)
        base, version, slas = self.slas_memo
        if base is not state.running_slas or version != self.version:
            slas = tuple({*state.running_slas, *self.slas})
            self.slas_memo = (state.running_slas, self.version, slas)
        return remaining, slas


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
        self._replicas.setdefault(replica_id, _Replica()).enter(key, entry)
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
        self._replicas[replica_id].live[key].confirmed = True  # its tentative heap entry goes stale

    def completed(self, replica_id: str, key: str, now: float) -> None:
        replica = self._replicas.get(replica_id)
        entry = replica.leave(key) if replica else None
        if entry is None:
            return
        self._where.pop(key, None)
        replica.pending.append((now, entry))

    def forget(self, replica_id: str) -> None:
        """The replica is gone: its requests ended with it."""
        replica = self._replicas.pop(replica_id, None)
        for key in replica.live if replica else ():
            self._where.pop(key, None)

    def in_flight(self, replica_id: str) -> int:
        replica = self._replicas.get(replica_id)
        return len(replica.live) if replica else 0

    def apply(
        self,
        state: ReplicaState,
        held: Collection[str],
        snapshot_at: float,
        now: float,
        cached_prefix: Container[str] | None = None,
    ) -> ReplicaState:
        """`state`, from a snapshot taken at `snapshot_at` that holds the route keys `held`, corrected by
        what this router sent that it does not hold and saw finish that it still holds; with
        `cached_prefix` when given. The state's age is kept as it is (the router passes ages beside
        states: router/balancer.py). This runs on every candidate of every decision: a corrected
        state is built once per change, not per call (the same arguments and totals: the same object)."""
        cached_prefix = state.cached_prefix if cached_prefix is None else cached_prefix
        replica = self._replicas.get(state.replica_id)
        added = gone = 0
        if replica is not None:
            self._expire(replica, now)
            replica.view(held, snapshot_at)
            added, gone = replica.added, replica.gone
        if not added and not gone and cached_prefix is state.cached_prefix:
            return state
        if replica is not None:
            base, version, cached, corrected = replica.applied
            if base is state and version == replica.version and cached is cached_prefix:
                return corrected
        if not added and not gone:
            corrected = replace(state, cached_prefix=cached_prefix)
        else:
            remaining_tokens, running_slas = replica.merged(state)
            running = max(0, state.running - gone)
            queued = state.queued + added - max(0, gone - state.running)
            free_pages = state.free_pages - replica.added_pages + replica.gone_pages
            corrected = ReplicaState(
                replica_id=state.replica_id,
                speed=state.speed,
                running=running,
                queued=max(0, queued),
                queued_prefill_tokens=state.queued_prefill_tokens + replica.added_prompt_tokens,
                free_pages=min(state.total_pages, free_pages)
                if state.speed is not None
                else state.free_pages,
                total_pages=state.total_pages,
                page_size=state.page_size,
                max_num_seqs=state.max_num_seqs,
                running_slas=running_slas,
                remaining_tokens=remaining_tokens,
                age_s=state.age_s,
                healthy=state.healthy,
                prefill_rate=state.prefill_rate,
                cached_prefix=cached_prefix,
            )
        if replica is not None:
            replica.applied = (state, replica.version, cached_prefix, corrected)
        return corrected

    def _drop(self, key: str) -> None:
        replica_id = self._where.pop(key, None)
        if replica_id is not None:
            self._replicas[replica_id].leave(key)

    def _expire(self, replica: _Replica, now: float) -> None:
        """Drop the unconfirmed requests sent more than tentative_ttl_s ago: the oldest first, from a heap
        whose entries for requests since confirmed or gone are skipped as they surface."""
        heap = replica.tentative
        while heap:
            sent_at, _, key, entry = heap[0]
            if replica.live.get(key) is not entry or entry.confirmed:
                heapq.heappop(heap)
            elif now - sent_at > self.tentative_ttl_s:
                heapq.heappop(heap)
                self._drop(key)
            else:
                break


def replica_state(
    replica_id: str,
    stats: Mapping | None,
    speed: Speed | None,
    slas: Mapping[str, Sla],
    default: Sla,
    age_s: float,
    prefill_rate: float = 0.0,
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
    prefix = stats.get("prefix_cache") or {}
    cached = (
        frozenset(prefix.get("hashes", ())) if int(prefix.get("page_size", 0)) == page_size else frozenset()
    )
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
        remaining_tokens=tuple(sorted(map(int, stats.get("remaining_tokens", ())))),
        age_s=age_s if math.isfinite(age_s) else math.inf,
        healthy=bool(stats.get("healthy", True)),
        prefill_rate=prefill_rate,
        cached_prefix=cached,
    )
