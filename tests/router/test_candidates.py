"""Which replicas a decision scores: a draw of `PolicyConfig.candidates` from a large fleet plus the
replicas this router sent the prompt's leading page (router/candidates.py), through the balancer and
through SLARequestRouter as Serve calls it."""

from __future__ import annotations

import asyncio
import random
import time

import pytest
from ray.serve._private.common import DeploymentHandleSource, DeploymentID, RequestMetadata
from ray.serve._private.request_router.common import RequestRoutingContext
from ray.serve.request_router import PendingRequest

from bench.route_decision import synthetic_stats
from router.balancer import Balancer
from router.candidates import Holders, draw
from router.policy import Newcomer, PolicyConfig, PromptPages
from router.serve_router import SLARequestRouter
from router.sla import DEFAULT_CLASS, DEFAULT_CLASSES, classes_of

SLAS = classes_of(DEFAULT_CLASSES)
IDS = [f"r{i}" for i in range(1000)]


def newcomer(pages: tuple[str, ...] = ()) -> Newcomer:
    prefix = PromptPages(16, pages) if pages else None
    return Newcomer(200, 64, SLAS["standard"], prefix=prefix)


def test_a_fleet_of_at_most_k_is_scored_whole_and_a_larger_one_draws_k():
    rng = random.Random(0)
    assert draw(IDS[:8], 8, rng) == IDS[:8]
    assert draw(IDS, None, rng) == IDS
    drawn = draw(IDS, 8, rng)
    assert len(drawn) == 8 == len(set(drawn)) and set(drawn) <= set(IDS)
    # Uniform: over many draws every replica is drawn, about k / n of the time.
    counts = dict.fromkeys(IDS, 0)
    for _ in range(2000):
        for rid in draw(IDS, 8, rng):
            counts[rid] += 1
    assert min(counts.values()) >= 1 and max(counts.values()) <= 50  # mean 16


def test_holders_join_the_draw_once_and_only_while_in_the_fleet():
    drawn = draw(IDS, 8, random.Random(1), holders=("r5", "gone", "r5"))
    assert drawn[:8] == draw(IDS, 8, random.Random(1)) and drawn.count("r5") == 1 and "gone" not in drawn
    already = draw(IDS, 8, random.Random(1))[0]
    assert draw(IDS, 8, random.Random(1), holders=(already,)) == draw(IDS, 8, random.Random(1))


def test_the_callers_set_of_the_fleet_tests_the_holders_and_changes_no_draw():
    live = dict.fromkeys(IDS)  # as SLARequestRouter keeps its replicas by id beside their list
    holders = ("r5", "gone", "r7")
    for seed in range(50):
        assert draw(IDS, 8, random.Random(seed), holders, live) == draw(IDS, 8, random.Random(seed), holders)
    # Membership is the caller's: a holder it no longer lists is not scored, whatever the list holds.
    drawn = draw(IDS, 8, random.Random(1), ("r5",), live.keys() - {"r5"})
    assert drawn == draw(IDS, 8, random.Random(1)) and "r5" not in drawn


def test_the_draw_depends_on_positions_and_the_seed_alone():
    # The simulator draws over its replica ids as it drew over its replica objects: the same positions.
    objects = [object() for _ in IDS]
    positions = [objects.index(o) for o in random.Random(7).sample(objects, 8)]
    assert draw(IDS, 8, random.Random(7)) == [IDS[i] for i in positions]


def test_holders_keep_the_most_recent_replicas_and_pages():
    holders = Holders(pages=2, per_page=2)
    for rid in ("a", "b", "c", "b"):
        holders.sent("p", rid)
    assert holders.of("p") == ("c", "b")
    holders.sent("q", "a")
    holders.sent("p", "d")  # p is now the most recently sent page
    holders.sent("s", "a")  # q goes
    assert holders.of("q") == () and holders.of("p") == ("b", "d") and holders.of("s") == ("a",)
    holders.forget("b")
    assert holders.of("p") == ("d",)


@pytest.mark.parametrize("k", [0, -1, 2.5, True, "8"])
def test_candidates_must_be_a_whole_number_of_at_least_one(k):
    with pytest.raises(ValueError, match="candidates must be a whole number"):
        PolicyConfig(candidates=k)


def fleet(n: int, now: float) -> dict[str, dict]:
    rng = random.Random(0)
    return {rid: synthetic_stats(i, rng, now) for i, rid in enumerate(IDS[:n])}


def test_the_balancer_scores_a_few_of_a_large_fleet_and_remembers_where_a_prefix_went():
    now = 1_000.0
    stats = fleet(1000, now)
    balancer = Balancer(PolicyConfig(), SLAS, DEFAULT_CLASS, seed=3)
    pages = tuple(f"sys-{j}" for j in range(8))
    chosen = balancer.candidates(IDS, newcomer(pages))
    decision = balancer.decide(newcomer(pages), "q0", {rid: stats[rid] for rid in chosen}, now)
    assert len(chosen) == 8 and len(decision.candidates) + len(decision.excluded) == 8
    assert decision.action == "route"
    first = decision.ranking[0]
    balancer.routed(first, "q0", newcomer(pages), now)
    # Every later prompt starting with that page scores the replica that has it, beside a fresh draw.
    for n in range(20):
        again = balancer.candidates(IDS, newcomer((*pages[:1], f"own-{n}")))
        assert first in again and len(again) in (8, 9)
    # Without pages, or with another leading page, only the draw.
    assert len(balancer.candidates(IDS, newcomer(("other",)))) == 8
    # Forgotten (its actor died): no longer remembered.
    balancer.forget(first)
    assert sum(first in balancer.candidates(IDS, newcomer(pages)) for _ in range(100)) <= 5  # drawn: 0.8
    assert Balancer(PolicyConfig(candidates=None), SLAS, DEFAULT_CLASS).candidates(IDS, newcomer()) == IDS


class StandInReplica:
    """Stands in for Serve's RunningReplica, which needs a live Ray actor per replica: 1,000 cannot run
    here. It carries what the router reads (replica_id.unique_id, routing_stats) and counts the reads."""

    reads = 0

    def __init__(self, rid: str, stats: dict) -> None:
        self.replica_id = type("ReplicaID", (), {"unique_id": rid})()
        self._stats = stats

    @property
    def routing_stats(self) -> dict:
        StandInReplica.reads += 1
        return self._stats


def pending(route: Newcomer, n: int) -> PendingRequest:
    metadata = RequestMetadata(request_id=f"req-{n}", internal_request_id=f"int-{n}")
    future = asyncio.get_running_loop().create_future()
    return PendingRequest([], {"route": route}, metadata, time.time(), future, RequestRoutingContext())


def test_serve_router_reads_the_stats_of_the_drawn_replicas_only():
    asyncio.run(serve_router_reads_the_drawn_replicas_only())


async def serve_router_reads_the_drawn_replicas_only() -> None:
    stats = fleet(1000, time.time())
    replicas = [StandInReplica(rid, s) for rid, s in stats.items()]
    router = SLARequestRouter(DeploymentID("TargetReplica", "app"), DeploymentHandleSource.UNKNOWN)
    router.initialize_state(
        classes={k: c.model_dump() for k, c in DEFAULT_CLASSES.items()}, default_class=DEFAULT_CLASS
    )
    for n in range(50):
        StandInReplica.reads = 0
        ranks = await router.choose_replicas(replicas, pending(newcomer(), n))
        assert StandInReplica.reads == 8 and 1 <= len(ranks) <= 8
        assert all(len(rank) == 1 and rank[0] in replicas for rank in ranks)
    # Serve passes a new list when its replicas change: one gone is never drawn again.
    survivors = replicas[1:]
    for n in range(300):
        ranks = await router.choose_replicas(survivors, pending(newcomer(), 100 + n))
        assert replicas[0] not in (rank[0] for rank in ranks)
