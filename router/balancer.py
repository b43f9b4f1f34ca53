"""The SLA router's state between decisions, without Ray: parsed stats per replica, the ledger, the RNG.

serve_router.py feeds it what Serve hands a RequestRouter (each replica's routing_stats, the routed and
completed callbacks) and returns its rankings to Serve. Serve calls it from its routing thread and from
completion callbacks, so every entry point takes one lock. A decision first draws the replicas it will
score (candidates(): a few of a large fleet, router/candidates.py), then decide() scores them: a few
hundred microseconds, whatever the fleet's size.

Prefix affinity needs the router's own memory too: a replica's pushed summary names the prompt pages it
caches only once a snapshot taken after their prefill arrives, so a second request with the same
prefix, sent before that, would see no replica holding it. The balancer remembers the pages of the
prompts it sent each replica for PREFIX_MEMORY_S, after which the pushed summary alone speaks (it
also tells which pages the replica kept).
"""

from __future__ import annotations

import math
import random
import threading
from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass, replace

from router import decisions
from router.candidates import Holders, draw
from router.policy import Decision, Newcomer, PolicyConfig, ReplicaState, Sla, decide
from router.signals import (
    Ledger,
    prefill_rate,
    prompt_tokens_admitted,
    replica_state,
    smooth_speed,
    speed_of,
)
from router.speed import Speed

PREFIX_MEMORY_S = 2.0  # a few stats periods (0.25 s) plus a prefill: then the pushed summary has it
PREFIX_MEMORY_PAGES = 4096  # per replica: bounds the memory under a flood of distinct prompts


class _Held(Container[str]):
    """The page hashes a replica is expected to cache: its pushed summary's and those sent since."""

    __slots__ = ("pushed", "sent")

    def __init__(self, pushed: Container[str], sent: Mapping[str, float]) -> None:
        self.pushed, self.sent = pushed, sent

    def __contains__(self, page: object) -> bool:
        return page in self.pushed or page in self.sent

    def __bool__(self) -> bool:
        return True


@dataclass
class _Parsed:
    """One replica's stats version, parsed once: the speed fit is the costly part."""

    version: object  # the stats' `ts`
    snapshot_at: float
    state: ReplicaState
    held: frozenset[str]  # the route keys the snapshot's engine runs
    prefix_caching: bool  # the replica caches prompt pages (its stats' prefix_cache is enabled)
    prompt_tokens: int | None  # cumulative prompt tokens admitted, as of this version
    prefill_rate: float | None  # prompt tokens per second reaching the replica (None: not measured yet)
    with_sent: _Held | None = None  # the pushed pages with those this router sent since (see _state)


def _prefill_rate(before: _Parsed | None, version: object, admitted: int | None) -> float | None:
    """The replica's prompt inflow from its previous version's count to this one's (on its own clock);
    the previous estimate when they cannot be compared (no count, no time between, a restart)."""
    if before is None:
        return None
    if admitted is None or before.prompt_tokens is None or version is None or before.version is None:
        return before.prefill_rate
    seconds = float(version) - float(before.version)
    if seconds <= 0 or admitted < before.prompt_tokens:
        return before.prefill_rate
    return prefill_rate(before.prefill_rate, admitted - before.prompt_tokens, seconds)


def _speed_before(parsed: _Parsed | None) -> Speed | None:
    return parsed.state.speed if parsed is not None else None


def _seconds_since(parsed: _Parsed | None, version: object) -> float:
    """Seconds from the previous stats version to `version` on the replica's clock (0: not comparable)."""
    if parsed is None or parsed.version is None or version is None:
        return 0.0
    return max(0.0, float(version) - float(parsed.version))


class Balancer:
    def __init__(
        self,
        config: PolicyConfig,
        classes: Mapping[str, Sla],
        default_class: str,
        prior_acceptance: float = 0.5,
        seed: int = 0,
        keep_decisions: bool = True,
    ) -> None:
        self.config = config
        # Keep each decision for the ingress to attach to its request's trace (router/decisions.py);
        # off where nobody collects them (the simulator), which would only fill the registry.
        self.keep_decisions = keep_decisions
        self.classes = dict(classes)
        self.default = self.classes[default_class]
        self.prior_acceptance = prior_acceptance
        self.ledger = Ledger()
        self._rng = random.Random(seed)
        # The candidate draw's own stream, so drawing never shifts the policy's tie-break draws.
        self._draw_rng = random.Random(seed + 1)
        self._holders = Holders()
        self._parsed: dict[str, _Parsed] = {}
        # replica id -> page hash -> when this router last sent a prompt with that page (oldest first)
        self._sent_pages: dict[str, dict[str, float]] = {}
        self._lock = threading.Lock()

    def candidates(
        self, replica_ids: Sequence[str], newcomer: Newcomer, live: Container[str] | None = None
    ) -> list[str]:
        """The replicas to score for `newcomer` (router/candidates.py): every one of a fleet of at most
        `config.candidates`, else that many drawn at random plus those this router sent its prompt's leading
        page (`live`: the same ids as a set or mapping, where the caller keeps one). Called before decide(),
        so that only their stats are read."""
        with self._lock:
            prefix = newcomer.prefix
            holders = self._holders.of(prefix.hashes[0]) if prefix is not None and prefix.hashes else ()
            return draw(replica_ids, self.config.candidates, self._draw_rng, holders, live)

    def decide(
        self,
        newcomer: Newcomer,
        key: str,
        stats: Mapping[str, Mapping | None],
        now: float,
        waited_s: float = 0.0,
    ) -> Decision:
        """Rank the replicas for `newcomer`; `stats` maps replica id -> its latest routing stats;
        `waited_s` how long the request has waited for a replica already (its TTFT counts it).

        A routed request enters the ledger at once (tentatively), so a burst decided before Serve
        confirms any of it does not all land on the same replica; one decided again withdraws its
        earlier, unconfirmed choice first (router/signals.py).
        """
        with self._lock:
            self.ledger.withdraw(key)
            states, ages = [], []
            for rid, s in stats.items():
                state, age = self._state(rid, s, now)
                states.append(state)
                ages.append(age)
            decision = decide(states, newcomer, self.config, self._rng, ages, waited_s)
            if decision.action == "route":
                first = decision.ranking[0]
                self.ledger.sent(first, key, newcomer, self._page_size(first), now)
                self._remember_pages(first, newcomer, now)
        if self.keep_decisions:
            decisions.record(newcomer.key, decision)
        return decision

    def routed(self, replica_id: str, key: str, newcomer: Newcomer, now: float) -> None:
        with self._lock:
            self.ledger.routed(replica_id, key, newcomer, self._page_size(replica_id), now)
            self._remember_pages(replica_id, newcomer, now)
        if self.keep_decisions:
            decisions.placed(newcomer.key, replica_id)

    def completed(self, replica_id: str, key: str, now: float) -> None:
        with self._lock:
            self.ledger.completed(replica_id, key, now)

    def forget(self, replica_id: str) -> None:
        with self._lock:
            self.ledger.forget(replica_id)
            self._parsed.pop(replica_id, None)
            self._sent_pages.pop(replica_id, None)
            self._holders.forget(replica_id)

    def states(self, stats: Mapping[str, Mapping | None], now: float) -> list[ReplicaState]:
        """What decide() would see now, each state with its age (for tests and the admin view)."""
        with self._lock:
            return [
                replace(state, age_s=age) for state, age in (self._state(r, s, now) for r, s in stats.items())
            ]

    def _state(self, replica_id: str, stats: Mapping | None, now: float) -> tuple[ReplicaState, float]:
        """The replica's state, corrected by the ledger, and its signals' age now. The state leaves the
        age out (inf) so that it stays the same object, not rebuilt, from one decision to the next while
        neither the stats nor the ledger change: decide() takes the ages beside the states."""
        parsed = self._parsed.get(replica_id)
        version = stats.get("ts") if stats else None
        if parsed is None or parsed.version != version:
            # First sight of this snapshot: it was taken no later than now, whatever the replica's clock.
            snapshot_at = min(float(version), now) if version is not None else -math.inf
            speed = speed_of(stats, self.prior_acceptance, self.config.calibrate_tpot) if stats else None
            if speed is not None:
                seconds = _seconds_since(parsed, version)
                speed = smooth_speed(_speed_before(parsed), speed, seconds, self.config.speed_half_life_s)
            admitted = prompt_tokens_admitted(stats) if stats else None
            rate = _prefill_rate(parsed, version, admitted)
            base = replica_state(replica_id, stats, speed, self.classes, self.default, math.inf, rate or 0.0)
            held = frozenset(stats.get("running_keys") or ()) if stats else frozenset()
            caching = bool(stats and (stats.get("prefix_cache") or {}).get("enabled"))
            parsed = _Parsed(version, snapshot_at, base, held, caching, admitted, rate)
            self._parsed[replica_id] = parsed
        state, age = parsed.state, now - parsed.snapshot_at  # inf without stats: snapshot_at is -inf
        if not stats:
            return self.ledger.apply(state, parsed.held, parsed.snapshot_at, now), age
        sent = self._recent_pages(replica_id, now)
        cached = state.cached_prefix
        if sent:
            # One view per sent-pages dict (it is read live), so the ledger can keep its corrected state.
            if parsed.with_sent is None or parsed.with_sent.sent is not sent:
                parsed.with_sent = _Held(state.cached_prefix, sent)
            cached = parsed.with_sent
        return self.ledger.apply(state, parsed.held, parsed.snapshot_at, now, cached), age

    def _remember_pages(self, replica_id: str, newcomer: Newcomer, now: float) -> None:
        parsed = self._parsed.get(replica_id)
        if newcomer.prefix is None or not newcomer.prefix.hashes or not (parsed and parsed.prefix_caching):
            return
        self._holders.sent(newcomer.prefix.hashes[0], replica_id)
        sent = self._sent_pages.setdefault(replica_id, {})
        for page in newcomer.prefix.hashes:
            sent.pop(page, None)  # re-inserted last: the dict stays ordered by time
            sent[page] = now
        while len(sent) > PREFIX_MEMORY_PAGES:
            del sent[next(iter(sent))]

    def _recent_pages(self, replica_id: str, now: float) -> dict[str, float] | None:
        sent = self._sent_pages.get(replica_id)
        while sent and next(iter(sent.values())) < now - PREFIX_MEMORY_S:
            del sent[next(iter(sent))]
        return sent or None

    def _page_size(self, replica_id: str) -> int:
        parsed = self._parsed.get(replica_id)
        return parsed.state.page_size if parsed else 16
