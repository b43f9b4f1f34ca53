"""A target replica's engine: built for the replica's Serve rank, rebuilt when Serve changes that rank.

`engine_by_rank` (deployments/config.py) makes a pool heterogeneous by Serve's replica rank: the replica
of rank r runs engine_by_rank[r % len]. Ray Serve (2.60, ray/serve/_private/deployment_state.py) treats
ranks as follows:
  - a starting replica gets the smallest released rank, or the next unused one; a stopping replica
    releases its rank only once it has stopped. So during a rolling update (a config change, an app
    redeployed) or while a crashed replica is replaced, new replicas can come up with ranks {0, 2};
  - once the deployment is HEALTHY with no replica starting and its membership has changed, Serve makes
    the ranks contiguous again (0..n-1), moving as few replicas as it can, and tells each moved replica
    through its `reconfigure(user_config, rank=...)`: the replica is UPDATING meanwhile, out of the set
    Serve's routers choose from, and comes back when reconfigure returns.
A replica that built its engine from its first rank and ignored later ones (what this project did until
now) could therefore end up running another rank's engine for good: the pool {0: drafter, 1: plain}
after a redeploy ran two drafter replicas.

So the replica subscribes to rank changes (TargetReplica.reconfigure) and, when its new rank's engine
differs from the one it runs, rebuilds it: it refuses new requests (AdmissionError: 429 /
RESOURCE_EXHAUSTED with a retry hint, for the few a router sent before it heard the replica left), lets
the ones running finish (up to the app's graceful_shutdown_timeout_s, then aborts the rest), stops the
old engine and only then builds the new one, so two engines never hold the device's memory at once.
Once Serve has compacted the ranks, the pool runs exactly the configured mix; until then (a rollout in
progress) it may not, as the pool is in flux anyway. A rank change that keeps the engine (rank 2 -> 0
of a two-entry list) costs nothing. This is Serve's own contract for rank-dependent replicas (a
`reconfigure` with a `rank` parameter subscribes to rank changes), so it holds for every way ranks move:
rolling updates, replacements, scaling down. tests/deployments/test_rank_rollout.py drives a real
rolling update to it.

Rejected: one Serve deployment per engine kind (stable keys, but a RequestRouter sees only its own
deployment's replicas, so the ingress would have to split load between deployments before the SLA
router could compare replicas, losing the router's point across kinds), and failing the health check
of a replica whose kind duplicates another's (Serve then restarts a whole process, marking the
deployment unhealthy meanwhile, and the replacement gets whatever rank Serve has free, which can again
be the wrong one while the failed replica's rank is still being released).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from deployments import replica_control, replica_state
from deployments.config import AppConfig
from dspark import cost_table
from dspark.async_engine import AsyncEngine
from dspark.config import EngineConfig
from dspark.engine import Engine

log = logging.getLogger(__name__)


@dataclass
class ReplicaEngine:
    """One engine of a replica and what is tied to it; built on any thread, installed on the loop."""

    config: EngineConfig
    engine: AsyncEngine
    tap: replica_control.RoundTap  # the cluster controller's window on acceptance
    routing_table: cost_table.CostTable  # what the SLA router predicts speed from
    tp_group: object | None  # deployments.tensor_parallel.TensorParallelGroup with tensor_parallel_size > 1
    build_s: float  # how long building it took: the retry hint of requests refused while rebuilding

    def stop(self) -> None:
        """Stop the engine (what still runs fails with EngineDeadError) and its shard workers; blocks."""
        self.engine.shutdown()
        if self.tp_group is not None:
            self.tp_group.stop(self.engine.engine)


def build(app: AppConfig, config: EngineConfig) -> ReplicaEngine:
    """Build the engine `config` describes as `app` runs it (tensor parallel or not); blocks."""
    start = time.monotonic()
    tp_group = None
    if app.tensor_parallel_size > 1:
        from deployments import tensor_parallel

        engine, tp_group = tensor_parallel.start(
            config, app.tensor_parallel_size, app.torch_num_threads, app.replica_num_cpus
        )
    else:
        engine = Engine(config)
    tap = replica_control.RoundTap(engine.gamma)
    engine.round_observers.append(tap.observe)
    # The SLA router predicts speed from SPS(B): profiled now (or read from the cache), before any
    # request holds the KV cache, if the engine schedules without a table of its own.
    routing_table = replica_state.routing_cost_table(engine)
    return ReplicaEngine(
        config, AsyncEngine(engine=engine), tap, routing_table, tp_group, time.monotonic() - start
    )
