"""The routing arms: Ray Serve's power-of-two and round robin as baselines, and the real SLA router.

The SLA arm is router.balancer.Balancer itself (router/policy.py's decide over router/signals.py's stats
parsing and ledger), fed the stats dicts replicas publish, exactly as SLARequestRouter feeds it inside
Serve. At scale it scores `candidates` replicas per request, drawn by the router itself (router/
candidates.py, the power-of-k-choices front the issue asks for: the decision cost stays flat in the fleet
size), as it does in Serve.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from dspark.prefix_cache import route_hashes
from router.balancer import Balancer
from router.policy import Newcomer, PolicyConfig, PromptPages, Sla
from sim.workload import Request

ARMS = ("pow2", "round_robin", "sla")


@dataclass(frozen=True)
class Choice:
    action: str  # route | wait | shed
    ranking: tuple[str, ...] = ()
    retry_after_s: float | None = None
    reason: str = ""


class RoundRobin:
    """Ray's RoundRobinRouter: the next replica in turn, skipping full ones (Serve tries the next)."""

    def __init__(self) -> None:
        self._next = 0

    def choose(self, req: Request, replicas: list, now: float) -> Choice:
        n = len(replicas)
        if n == 0:
            return Choice("wait")
        start = self._next % n
        self._next += 1
        order = replicas[start:] + replicas[:start]
        return Choice("route", tuple(r.replica_id for r in order if r.has_slot()) or ())

    def routed(self, replica_id: str, req: Request, now: float) -> None: ...
    def completed(self, replica_id: str, req: Request, now: float) -> None: ...
    def forget(self, replica_id: str) -> None: ...


class PowerOfTwo:
    """Ray Serve's default: two random replicas with room, the one with fewer requests in flight."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def choose(self, req: Request, replicas: list, now: float) -> Choice:
        # Sample first, check room after: with room for most replicas this is O(1), not O(fleet).
        for _ in range(8):
            picks = self.rng.sample(replicas, min(2, len(replicas))) if replicas else []
            picks = [r for r in picks if r.has_slot()]
            if picks:
                break
        else:
            picks = [r for r in replicas if r.has_slot()]
            picks = self.rng.sample(picks, min(2, len(picks)))
        if not picks:
            return Choice("wait")
        picks.sort(key=lambda r: len(r.seqs))
        return Choice("route", tuple(r.replica_id for r in picks))

    def routed(self, replica_id: str, req: Request, now: float) -> None: ...
    def completed(self, replica_id: str, req: Request, now: float) -> None: ...
    def forget(self, replica_id: str) -> None: ...


class SlaArm:
    """The real SLA router (router.balancer.Balancer), scoring the replicas its own candidate draw picks
    (router/candidates.py: `candidates` of a larger fleet, as SLARequestRouter does inside Serve)."""

    def __init__(
        self,
        classes: Mapping[str, Sla],
        default_class: str,
        stats: Callable[[str], Mapping | None],
        seed: int,
        candidates: int | None = 8,
        config: PolicyConfig | None = None,
        prior_acceptance: float = 0.5,
        page_size: int | None = None,
        *,
        replica_ids: Sequence[str],
    ) -> None:
        self.classes = dict(classes)
        # The replicas cache prefixes in pages of this many tokens: a prompt whose token ids the trace
        # carries is named page by page once, as the frontend does (deployments/frontend.py
        # routed_prompt), for the policy to match against each replica's cached pages. None: no caching.
        self.page_size = page_size
        self._pages: tuple[int, PromptPages] | None = None  # the last request's: decided, then routed
        self.stats = stats
        # The live fleet's ids in fleet order, kept by the cluster as replicas fail and return: the draw
        # picks from them without naming the whole fleet on every request.
        self.replica_ids = replica_ids
        self.balancer = Balancer(
            replace(config or PolicyConfig(), candidates=candidates),
            self.classes,
            default_class,
            prior_acceptance,
            seed,
            keep_decisions=False,
        )
        # Each decision's wall seconds, and its thread CPU seconds (the candidate draw, reading their
        # stats, Balancer.decide): on a shared machine the wall time's tail is other processes' time
        # slices, the CPU time is the decision's own cost.
        self.decision_s: list[float] = []
        self.decision_cpu_s: list[float] = []

    def newcomer(self, req: Request) -> Newcomer:
        pages = None
        if self.page_size is not None and req.prompt_ids is not None:
            if self._pages is None or self._pages[0] != req.rid:
                hashes = tuple(route_hashes(req.prompt_ids, self.page_size))
                self._pages = (req.rid, PromptPages(self.page_size, hashes))
            pages = self._pages[1]
        sla = self.classes[req.sla_class]
        return Newcomer(req.prompt_tokens, req.max_tokens, sla, key=str(req.rid), prefix=pages)

    def choose(self, req: Request, replicas: list, now: float) -> Choice:
        start, cpu = time.perf_counter(), time.thread_time()
        newcomer = self.newcomer(req)
        stats = {rid: self.stats(rid) for rid in self.balancer.candidates(self.replica_ids, newcomer)}
        waited = max(0.0, now - req.arrival)  # its TTFT runs from its arrival
        decision = self.balancer.decide(newcomer, str(req.rid), stats, now, waited)
        self.decision_cpu_s.append(time.thread_time() - cpu)
        self.decision_s.append(time.perf_counter() - start)
        if decision.action == "route":
            return Choice("route", decision.ranking, reason=decision.reason)
        return Choice(decision.action, (), decision.retry_after_s, decision.reason)

    def routed(self, replica_id: str, req: Request, now: float) -> None:
        self.balancer.routed(replica_id, str(req.rid), self.newcomer(req), now)

    def completed(self, replica_id: str, req: Request, now: float) -> None:
        self.balancer.completed(replica_id, str(req.rid), now)

    def forget(self, replica_id: str) -> None:
        self.balancer.forget(replica_id)
