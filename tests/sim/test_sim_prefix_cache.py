"""Prefix caching in the simulated replicas: the engine's own page manager, on the token ids a trace
carries, and the SLA router told each prompt's page names as the frontend tells it."""

from __future__ import annotations

import dataclasses

from deployments.replica_state import RecentRounds
from dspark.prefix_cache import route_hashes
from router.policy import Sla
from sim.cluster import Cluster, ClusterConfig, Group
from sim.replica import SimReplica
from sim.routing import SlaArm
from sim.stats import snapshot
from sim.workload import Request
from tests.sim.test_simulator import CLASSES, small_profile


def caching_profile(**overrides):
    return small_profile(**{"prefix_caching": True, "kv_pages": 256, **overrides})


def prompt(source: int, length: int) -> tuple[int, ...]:
    """Token ids of a prompt cut from source text `source`: two cuts of one source share their start."""
    return tuple(1000 * source + j for j in range(length))


def request(rid: int, ids: tuple[int, ...] | None, length: int = 0, arrival: float = 0.0) -> Request:
    n = len(ids) if ids is not None else length
    return Request(rid, arrival, n, 8, "standard", "easy", prompt_ids=ids)


def prefill(replica: SimReplica, now: float = 0.0) -> list:
    """Step until no request is prefilling; returns the chunks (request id, tokens) each step ran."""
    chunks = []
    while any(not s.decoding for s in replica.seqs.values()):
        plan = replica.plan()
        chunks.append([(s.req.rid, n) for s, n in plan.chunks])
        replica.complete(plan, now)
    return chunks


def test_a_prompt_reuses_the_full_pages_an_earlier_prompt_committed_on_its_replica():
    replica = SimReplica("r", caching_profile(), seed=1)
    assert replica.admit(request(0, prompt(7, 50))) is None
    assert prefill(replica) == [[(0, 50)]]
    # The same text cut shorter (40 tokens): its two full pages are cached, its last 8 tokens run.
    assert replica.admit(request(1, prompt(7, 40))) is None
    assert replica.seqs[1].computed == 32 and replica.counters.cached_prompt_tokens == 32
    assert prefill(replica) == [[(1, 8)]]
    # Never the page of the last prompt token (it makes the first output token): 48 tokens reuse 2 pages.
    assert replica.admit(request(2, prompt(7, 48))) is None and replica.seqs[2].computed == 32
    # Another text, and a request whose trace carries no ids, reuse nothing.
    assert replica.admit(request(3, prompt(8, 50))) is None and replica.seqs[3].computed == 0
    assert replica.admit(request(4, None, length=50)) is None and replica.seqs[4].computed == 0
    assert replica.counters.cached_prompt_tokens == 64
    # Its stats carry the counts and the cached pages' names, as a real replica's prefix_cache does.
    stats = snapshot(replica, RecentRounds(), 1.0)["prefix_cache"]
    assert stats["enabled"] and stats["cached_prompt_tokens"] == 64 and stats["page_size"] == 16
    assert set(route_hashes(prompt(7, 50), 16)) <= set(stats["hashes"])


def test_an_engine_without_prefix_caching_prefills_every_prompt_whole():
    replica = SimReplica("r", small_profile(kv_pages=256), seed=1)
    for rid in range(2):
        assert replica.admit(request(rid, prompt(7, 50))) is None
    assert prefill(replica) == [[(0, 50), (1, 50)]]
    assert replica.counters.cached_prompt_tokens == 0
    assert snapshot(replica, RecentRounds(), 1.0)["prefix_cache"]["enabled"] is False


def test_a_prompt_waiting_behind_another_reuses_its_pages_once_they_are_committed():
    # A 32-token step budget: the second request waits while the first prefills, then finds the first's
    # committed pages (Engine._build_items reuses them before taking its chunk).
    replica = SimReplica("r", caching_profile(max_num_batched_tokens=32), seed=1)
    for rid in range(2):
        assert replica.admit(request(rid, prompt(7, 70))) is None
    chunks = prefill(replica)
    assert chunks[:2] == [[(0, 32)], [(0, 32)]]
    assert (1, 70 - 64) in chunks[2]  # four pages reused, 6 tokens run
    assert replica.counters.cached_prompt_tokens == 64


def test_shared_pages_count_once_and_all_come_back():
    profile = caching_profile()
    requests = [request(i, prompt(i % 3, 30 + 7 * i), arrival=0.05 * i) for i in range(24)]
    config = ClusterConfig(fleet=[Group(profile, 2)], classes=CLASSES, default_class="standard", seed=4)
    cluster = Cluster(config, requests)
    cluster.run(60.0)
    assert all(r.outcome == "done" and r.generated == r.max_tokens for r in requests)
    replicas = cluster.all_replicas()
    cached = sum(r.counters.cached_prompt_tokens for r in replicas)
    prefilled = sum(r.counters.forward_tokens for r in replicas) - sum(
        r.counters.rounds + r.counters.drafted_tokens for r in replicas
    )
    assert cached > 0 and prefilled + cached == sum(r.prompt_tokens for r in requests)
    for r in replicas:
        assert not r.seqs and r.pages.num_free_pages == r.pages.num_pages  # cached pages are free to evict
        assert r.pages.num_cached_pages > 0


def test_the_sla_router_is_told_each_prompts_page_names_when_the_replicas_cache_prefixes():
    sla = {"standard": Sla("standard", 3.0, 0.06, 1, False)}
    arm = SlaArm(sla, "standard", lambda _: None, seed=0, page_size=16, replica_ids=())
    pages = arm.newcomer(request(0, prompt(7, 50))).prefix
    assert (
        pages is not None and pages.page_size == 16 and pages.hashes == tuple(route_hashes(prompt(7, 50), 16))
    )
    assert arm.newcomer(request(1, None, length=50)).prefix is None
    assert (
        SlaArm(sla, "standard", lambda _: None, seed=0, replica_ids=())
        .newcomer(request(0, prompt(7, 50)))
        .prefix
        is None
    )
    # The cluster names pages for the router only when its replicas cache prefixes.
    for caching in (True, False):
        fleet = [Group(dataclasses.replace(small_profile(), prefix_caching=caching), 1)]
        cluster = Cluster(ClusterConfig(fleet=fleet, classes=CLASSES, default_class="standard"), [])
        assert cluster.router.page_size == (16 if caching else None)


def test_the_sla_router_sends_a_long_shared_prompt_where_it_is_cached():
    # One replica has prefilled a long prompt; the same prompt again later is predicted to skip most of
    # its prefill there and goes there, where with the page names withheld the router sees no difference.
    profile = caching_profile(kv_pages=512)
    long_prompt = prompt(9, 600)

    def second_goes_with_the_first(pages: bool, seed: int) -> bool:
        requests = [request(0, long_prompt), request(1, long_prompt, arrival=2.0)]
        config = ClusterConfig(
            fleet=[Group(profile, 4)], classes=CLASSES, default_class="standard", seed=seed
        )
        cluster = Cluster(config, requests)
        if not pages:
            cluster.router.page_size = None
        cluster.run(30.0)
        return requests[0].replica == requests[1].replica

    assert all(second_goes_with_the_first(True, seed) for seed in range(6))
    assert not all(second_goes_with_the_first(False, seed) for seed in range(6))


def test_a_warmed_replica_holds_the_prompts_pages_as_one_that_served_them_before():
    replica = SimReplica("r", caching_profile(), seed=1)
    free = replica.pages.num_free_pages
    replica.warm([prompt(7, 50), prompt(8, 48)])
    # Nothing in use and no counter moved; the pages are cached (evictable) and named in its stats.
    assert replica.pages.num_free_pages == free and not replica.seqs
    assert replica.counters.prompt_tokens == replica.counters.cached_prompt_tokens == 0
    stats = snapshot(replica, RecentRounds(), 1.0)["prefix_cache"]
    assert set(route_hashes(prompt(8, 48), 16)) <= set(stats["hashes"])
    assert replica.admit(request(0, prompt(8, 48))) is None and replica.seqs[0].computed == 32
    assert replica.admit(request(1, prompt(7, 50))) is None and replica.seqs[1].computed == 48
    uncached = SimReplica("u", small_profile(kv_pages=256), seed=1)
    uncached.warm([prompt(7, 50)])
    assert uncached.admit(request(0, prompt(7, 50))) is None and uncached.seqs[0].computed == 0


def repeated_prefixes(sources: int = 60, repeats: int = 4) -> list[Request]:
    """Each of `sources` prompts' first 128 tokens (8 pages) sent `repeats` times, a second apart, each
    time with a suffix of its own: a conversation's history coming back with its next turn."""
    requests, rid = [], 0
    for turn in range(repeats):
        for source in range(sources):
            suffix = tuple(10_000_000 + 100 * rid + j for j in range(16))
            requests.append(request(rid, prompt(source, 128) + suffix, arrival=turn + source / sources))
            rid += 1
    return requests


def cached_share(cluster: Cluster, requests: list[Request]) -> float:
    repeated = sum(r.prompt_tokens for r in requests[len(requests) // 4 :])
    return sum(r.counters.cached_prompt_tokens for r in cluster.all_replicas()) / repeated


def test_at_scale_the_router_still_finds_the_replica_holding_a_prompts_pages(monkeypatch):
    # 40 replicas, each decision scoring 8 drawn plus those this router sent the prompt's leading page
    # (router/candidates.py): the repeats land where their pages are, as when every replica is scored.
    def run(candidates: int | None) -> float:
        requests = repeated_prefixes()
        fleet = [Group(caching_profile(), 40)]
        config = ClusterConfig(fleet, CLASSES, "standard", seed=2, candidates=candidates)
        cluster = Cluster(config, requests)
        cluster.run(30.0)
        assert all(r.outcome == "done" for r in requests)
        return cached_share(cluster, requests)

    drawn, every = run(8), run(None)
    assert every > 0.7 and drawn > 0.9 * every
    # Without the router's memory of where it sent each leading page, a draw of 8 of 40 mostly misses.
    monkeypatch.setattr("router.candidates.Holders.of", lambda self, page: ())
    assert run(8) < 0.5 * drawn
