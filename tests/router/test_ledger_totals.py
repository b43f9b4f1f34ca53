"""The ledger's running totals equal a from-scratch recomputation after any sequence of events.

`Ledger.apply` keeps its corrections as totals updated on send, confirm, finish, expiry and new
snapshots (router/signals.py), so a decision does not scan the requests in flight. The reference below
recomputes every correction from the full lists on every call, as the ledger did before; a long seeded
random sequence of events (re-sends, withdrawals, placements elsewhere, completions, forgotten replicas,
snapshots new and repeated, tentative entries expiring) must give identical states.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

import pytest

from router.policy import Newcomer, ReplicaState, Sla, pages_for
from router.signals import Ledger

CLASSES = (
    Sla("interactive", ttft_s=1.0, tpot_s=0.05, priority=0, may_shed=True),
    Sla("standard", ttft_s=5.0, tpot_s=0.25, priority=1),
    Sla("batch", ttft_s=30.0, tpot_s=1.0, priority=2),
)


@dataclass
class _Entry:
    route_key: str
    prompt_tokens: int
    max_tokens: int
    pages: int
    sla: Sla
    sent_at: float
    confirmed: bool = False


@dataclass
class ReferenceLedger:
    """The corrections recomputed from every entry on every call (the ledger's semantics, spelled out)."""

    ttl: float
    live: dict[str, dict[str, _Entry]] = field(default_factory=dict)
    done: dict[str, list[tuple[float, _Entry]]] = field(default_factory=dict)
    where: dict[str, str] = field(default_factory=dict)

    def sent(self, rid: str, key: str, newcomer: Newcomer, page_size: int, now: float) -> None:
        self.drop(key)
        pages = pages_for(newcomer.prompt_tokens + newcomer.max_tokens, page_size)
        entry = _Entry(newcomer.key, newcomer.prompt_tokens, newcomer.max_tokens, pages, newcomer.sla, now)
        self.live.setdefault(rid, {})[key] = entry
        self.done.setdefault(rid, [])
        self.where[key] = rid

    def withdraw(self, key: str) -> None:
        rid = self.where.get(key)
        if rid is not None and not self.live[rid][key].confirmed:
            self.drop(key)

    def routed(self, rid: str, key: str, newcomer: Newcomer, page_size: int, now: float) -> None:
        if self.where.get(key) != rid:
            self.sent(rid, key, newcomer, page_size, now)
        self.live[rid][key].confirmed = True

    def completed(self, rid: str, key: str, now: float) -> None:
        entry = self.live.get(rid, {}).pop(key, None)
        if entry is not None:
            self.where.pop(key)
            self.done[rid].append((now, entry))

    def forget(self, rid: str) -> None:
        for key in self.live.pop(rid, {}):
            self.where.pop(key)
        self.done.pop(rid, None)

    def drop(self, key: str) -> None:
        rid = self.where.pop(key, None)
        if rid is not None:
            del self.live[rid][key]

    def apply(self, state: ReplicaState, held, snapshot_at: float, now: float) -> ReplicaState:
        rid = state.replica_id
        if rid not in self.live:
            return state
        for key, s in list(self.live[rid].items()):
            if not s.confirmed and now - s.sent_at > self.ttl:
                self.drop(key)
        self.done[rid] = [(t, s) for t, s in self.done[rid] if s.route_key in held or t > snapshot_at]
        added = [s for s in self.live[rid].values() if s.route_key not in held]
        gone = [s for _, s in self.done[rid] if s.route_key in held]
        if not added and not gone:
            return state
        free_pages = state.free_pages - sum(s.pages for s in added) + sum(s.pages for s in gone)
        return replace(
            state,
            running=max(0, state.running - len(gone)),
            queued=max(0, state.queued + len(added) - max(0, len(gone) - state.running)),
            queued_prefill_tokens=state.queued_prefill_tokens + sum(s.prompt_tokens for s in added),
            free_pages=min(state.total_pages, free_pages) if state.speed is not None else state.free_pages,
            running_slas=tuple({*state.running_slas, *(s.sla for s in self.live[rid].values())}),
            remaining_tokens=tuple(sorted((*state.remaining_tokens, *(s.max_tokens for s in added)))),
        )


def _comparable(state: ReplicaState) -> ReplicaState:
    # running_slas is a set of classes (its order is a set's): compared as one.
    return replace(state, running_slas=frozenset(state.running_slas))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_running_totals_equal_a_from_scratch_recomputation(seed: int) -> None:
    rng = random.Random(seed)
    ttl = 1.0
    ledger, reference = Ledger(tentative_ttl_s=ttl), ReferenceLedger(ttl)
    replicas = [f"r{i}" for i in range(4)]
    keys = [f"q{i}" for i in range(60)]  # Serve's request ids, reused: re-sends and re-decisions
    speed = object()  # apply only asks whether a replica has stats (speed is not None)
    newcomers: dict[str, Newcomer] = {}
    # Per replica: the current snapshot (held keys as one frozenset object, its time, base state).
    snapshots: dict[str, tuple[frozenset, float, ReplicaState]] = {}
    now, applied, corrected = 0.0, 0, 0

    def new_snapshot(rid: str) -> None:
        in_flight = [newcomers[k].key for k in keys if k in newcomers]
        held = frozenset(rng.sample(in_flight, min(len(in_flight), rng.randint(0, 12))))
        base = ReplicaState(
            rid,
            speed if rng.random() < 0.9 else None,
            running=rng.randint(0, 6),
            queued=rng.randint(0, 3),
            queued_prefill_tokens=rng.randint(0, 500),
            free_pages=rng.randint(0, 200),
            total_pages=200,
            running_slas=tuple(rng.sample(CLASSES, rng.randint(0, 2))),
            remaining_tokens=tuple(sorted(rng.randint(1, 300) for _ in range(rng.randint(0, 6)))),
            age_s=0.1,
        )
        snapshots[rid] = (held, now - rng.choice([0.0, 0.0, 0.05, 0.3]), base)  # 0: ties a completion

    for _ in range(4000):
        now += rng.choice([0.0, 0.01, 0.05, 0.2, 0.7])
        rid, key = rng.choice(replicas), rng.choice(keys)
        event = rng.random()
        if event < 0.25:
            route_key = f"route-{key}-{rng.randint(0, 2)}"  # sometimes a key a snapshot already held
            sla = rng.choice(CLASSES)
            newcomers[key] = Newcomer(rng.randint(1, 400), rng.randint(1, 300), sla, key=route_key)
            page_size = rng.choice([8, 16])
            ledger.sent(rid, key, newcomers[key], page_size, now)
            reference.sent(rid, key, newcomers[key], page_size, now)
        elif event < 0.30:
            ledger.withdraw(key)
            reference.withdraw(key)
        elif event < 0.42 and key in newcomers:
            ledger.routed(rid, key, newcomers[key], 16, now)
            reference.routed(rid, key, newcomers[key], 16, now)
        elif event < 0.55:
            target = reference.where.get(key, rid)
            ledger.completed(target, key, now)
            reference.completed(target, key, now)
        elif event < 0.56:
            ledger.forget(rid)
            reference.forget(rid)
        elif event < 0.62 or rid not in snapshots:
            new_snapshot(rid)
        else:
            held, snapshot_at, base = snapshots[rid]
            if rng.random() < 0.2:
                held = frozenset(held)  # the same snapshot, handed over as another (equal) object
            got = ledger.apply(base, held, snapshot_at, now)
            want = reference.apply(base, held, snapshot_at, now)
            assert _comparable(got) == _comparable(want)
            applied += 1
            corrected += got != base
        for r in replicas:
            assert ledger.in_flight(r) == len(reference.live.get(r, {}))
    # The sequence exercised both outcomes many times (a test that cannot fail would not).
    assert applied > 500 and corrected > 200 and applied - corrected > 50
