"""SLARequestRouter: the SLA policy (router/policy.py) as a Ray Serve RequestRouter.

It runs in every process that calls TargetReplica through a handle, i.e. in each ingress replica, on
Serve's routing thread. The request's routing inputs travel as the `route` keyword of
TargetReplica.generate (a router.policy.Newcomer: prompt tokens, max_tokens, SLA), which Serve shows the
router as `pending_request.kwargs`; calls without it (model_info) go to the least loaded replica.

Which replicas it scores. Serve offers every running replica on every request; the balancer draws
`PolicyConfig.candidates` of a larger fleet (and the replicas it sent the prompt's leading page), and
only their stats are read (router/candidates.py): the decision stays flat in the fleet's size.

How Serve uses the answer. `choose_replicas` returns singleton ranks in the policy's order, so Serve
sends to the first choice unless that replica is at max_ongoing_requests, then tries the next. An empty
answer (no replica has room for a class that waits) makes Serve back off and ask again: `should_backoff`
is set, or it would spin. A refusal cannot be raised from choose_replicas (Serve logs the exception and
routes the request again, forever); instead the request's own future is failed with an AdmissionError,
which Serve's router raises to the caller, the ingress, as it would any routing error: a 429 /
RESOURCE_EXHAUSTED with the retry hint (deployments/errors.py).

Which request gets the choice. Serve hands a replica found by one routing task to a pending request:
by default the one with the same internal request id, which all handle calls made while serving one
ingress request share (concurrent calls would then wait forever); FIFOMixin avoids that but gives the
replica to the oldest pending request, whose own ranking may differ. The choice here depends on the
request, so the FIFOMixin's matching hook is answered with the very request the ranking was made for.

Pinned calls. A call with a `pinned_replica` keyword (an ingress' stream subscription,
deployments/mux_client.py) goes to that replica and no other: the replica its requests were placed on
by the policy above. A pinned replica that is gone fails the call (its streams end with that error).
"""

from __future__ import annotations

import time
import weakref
from typing import Any

from ray.serve.request_router import FIFOMixin, PendingRequest, ReplicaID, RequestRouter, RunningReplica

from dspark.errors import AdmissionError
from router.balancer import Balancer
from router.policy import Newcomer, PolicyConfig
from router.sla import SlaClass, classes_of

PINNED = "pinned_replica"  # the keyword naming the one replica a call must reach


class ReplicaGoneError(RuntimeError):
    """A pinned call's replica is no longer among the deployment's replicas."""


class SLARequestRouter(FIFOMixin, RequestRouter):
    def initialize_state(
        self,
        classes: dict[str, dict],
        default_class: str,
        options: dict | None = None,
        prior_acceptance: float = 0.5,
        seed: int = 0,
    ) -> None:
        slas = classes_of({name: SlaClass(**c) for name, c in classes.items()})
        self.balancer = Balancer(PolicyConfig(**(options or {})), slas, default_class, prior_acceptance, seed)
        # id(metadata) -> the request a ranking was made for (weak: a cancelled one just disappears).
        self._ranked_for: weakref.WeakValueDictionary[int, PendingRequest] = weakref.WeakValueDictionary()
        self._pool_of: tuple[list[RunningReplica] | None, dict[str, RunningReplica], list[str]] = (
            None,
            {},
            [],
        )

    def _pool(self, replicas: list[RunningReplica]) -> tuple[dict[str, RunningReplica], list[str]]:
        """The replicas by id and their ids in order, kept while Serve passes the same list: it builds a new
        one when its replicas change, and naming 1,000 of them on every request would cost more than the
        decision over the few it scores."""
        held, by_id, ids = self._pool_of
        if held is not replicas or len(ids) != len(replicas):
            by_id = {r.replica_id.unique_id: r for r in replicas}
            ids = list(by_id)
            self._pool_of = (replicas, by_id, ids)
        return by_id, ids

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        kwargs = pending_request.kwargs if pending_request is not None else {}
        pinned = kwargs.get(PINNED)
        if isinstance(pinned, str):
            return self._pin(pinned, candidate_replicas, pending_request)
        route = kwargs.get("route")
        if not isinstance(route, Newcomer):
            return [candidate_replicas]
        pending_request.routing_context.should_backoff = True
        by_id, ids = self._pool(candidate_replicas)
        # A few of a large fleet (router/candidates.py): their stats are all a decision reads.
        stats = {rid: by_id[rid].routing_stats for rid in self.balancer.candidates(ids, route, by_id)}
        now = time.time()
        waited = max(0.0, now - pending_request.created_at)  # in Serve's queue: its TTFT runs already
        decision = self.balancer.decide(
            route, pending_request.metadata.internal_request_id, stats, now, waited
        )
        if decision.action == "shed":
            if not pending_request.future.done():
                pending_request.future.set_exception(AdmissionError(decision.reason, decision.retry_after_s))
            return [candidate_replicas]  # Serve sees the request done and stops routing it
        self._ranked_for[id(pending_request.metadata)] = pending_request
        return [[by_id[rid]] for rid in decision.ranking]

    def _pin(
        self, replica_id: str, candidates: list[RunningReplica], pending_request: PendingRequest
    ) -> list[list[RunningReplica]]:
        for replica in candidates:
            if replica.replica_id.unique_id == replica_id:
                self._ranked_for[id(pending_request.metadata)] = pending_request
                return [[replica]]
        if not pending_request.future.done():
            pending_request.future.set_exception(ReplicaGoneError(f"replica {replica_id} is gone"))
        return [candidates]  # Serve sees the request done and stops routing it

    def _get_pending_request_matching_metadata(self, request_metadata: Any = None) -> PendingRequest | None:
        """FIFOMixin's matching hook: the request this ranking was made for, while it still waits."""
        if request_metadata is None:
            return None
        pending = self._ranked_for.pop(id(request_metadata), None)
        if pending is None or pending.metadata is not request_metadata or pending.future.done():
            return None
        return pending

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any) -> None:
        route = pending_request.kwargs.get("route")
        if isinstance(route, Newcomer):
            key = pending_request.metadata.internal_request_id
            self.balancer.routed(replica_id.unique_id, key, route, time.time())

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        self.balancer.completed(replica_id.unique_id, internal_request_id, time.time())

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self.balancer.forget(replica_id.unique_id)
