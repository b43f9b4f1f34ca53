"""Which replicas one routing decision scores: a few drawn at random, plus those holding the prompt's pages.

Serve hands a RequestRouter every running replica on every request
(RequestRouter._choose_replicas_with_backoff passes its whole replica list), and the policy predicts what
the request would see on each one it scores. Scoring all of them makes a decision grow with the fleet: at
1,000 replicas one took 8.9 ms at p50 and 101 ms at p99 (bench/results/route_decision.json,
cases_all_scored, periodic), so one ingress could route about 100 requests a second. Scoring
`PolicyConfig.candidates` replicas drawn uniformly (the power of k choices; Ray Serve's default router draws
two) keeps a decision flat in the fleet size: in the simulator 8 matched 16's SLA attainment at 100
GPU-class replicas and 80 % load (sim/cluster.py ClusterConfig.candidates), at a third less decision time.

A uniform draw finds the replicas that cache a prompt's leading pages with a chance of k in n, and prefix
affinity needs them scored (the policy predicts their skipped prefill, router/policy.py). So the router
remembers, by a prompt's leading page, the replicas it last sent prompts starting with it (`Holders`,
bounded), and those join the draw. It knows only what it sent itself: a replica that cached the prefix
for another router (another ingress replica) is scored when the draw finds it.
"""

from __future__ import annotations

import random
from collections.abc import Container, Iterable, Sequence

HOLDER_PAGES = 4096  # leading pages remembered (the least recently sent forgotten first)
HOLDERS_PER_PAGE = 4  # replicas remembered per leading page (the most recent)


def draw(
    replica_ids: Sequence[str],
    k: int | None,
    rng: random.Random,
    holders: Iterable[str] = (),
    live: Container[str] | None = None,
) -> list[str]:
    """The replicas to score: all of `replica_ids` when there are at most `k` (or `k` is None); else `k`
    drawn uniformly without replacement, then each of `holders` among `replica_ids` not drawn already.
    `live`: the same ids as a set or mapping the caller keeps beside the list, for that membership test;
    None: a set of them is built here when a holder is not drawn (at 1,000 replicas ~30 us, a tenth to a
    twentieth of a decision).

    The draw takes `replica_ids`' order and `rng` alone: the same ids in the same order draw the same
    replicas, whatever they are (random.sample picks positions)."""
    if k is None or len(replica_ids) <= k:
        return list(replica_ids)
    drawn = rng.sample(replica_ids, k)
    for holder in holders:
        if holder not in drawn:
            live = set(replica_ids) if live is None else live
            if holder in live:
                drawn.append(holder)
    return drawn


class Holders:
    """Replicas this router sent prompts to, by the prompts' leading page (most recent last)."""

    def __init__(self, pages: int = HOLDER_PAGES, per_page: int = HOLDERS_PER_PAGE) -> None:
        self.pages, self.per_page = pages, per_page
        self._by_page: dict[str, dict[str, None]] = {}  # ordered: least recently sent page first

    def sent(self, leading_page: str, replica_id: str) -> None:
        replicas = self._by_page.pop(leading_page, None) or {}
        replicas.pop(replica_id, None)
        replicas[replica_id] = None
        while len(replicas) > self.per_page:
            del replicas[next(iter(replicas))]
        self._by_page[leading_page] = replicas
        while len(self._by_page) > self.pages:
            del self._by_page[next(iter(self._by_page))]

    def of(self, leading_page: str) -> tuple[str, ...]:
        return tuple(self._by_page.get(leading_page, ()))

    def forget(self, replica_id: str) -> None:
        for replicas in self._by_page.values():
            replicas.pop(replica_id, None)
