"""Ray glue for a tensor-parallel target: shard ranks 1..N-1 as actors in the replica's placement group.

The replica itself is rank 0 (bundle 0 of its STRICT_PACK group, with the engine and the drafter);
`dspark.tp` does the sharding and the lockstep forward. This file only places processes and
rendezvouses them. Every rank loads only its own shard, all at once; the followers start following
before rank 0's engine exists, so the engine's cost-table profile runs on all shards in lockstep.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from datetime import timedelta

import ray
import torch
import torch.distributed as dist
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from dspark import tp
from dspark.config import EngineConfig
from dspark.engine import Engine

# Bounds rendezvous and every collective; an idle group stays inside it through keepalives.
TIMEOUT = timedelta(minutes=10)
KEEPALIVE_PERIOD_S = 60.0


def _backend(config: EngineConfig) -> str:
    return "nccl" if config.device.startswith("cuda") else "gloo"


@ray.remote
class ShardWorker:
    """Ranks > 0: join the group, load a shard, then follow rank 0's forwards until told to stop."""

    def __init__(
        self, config: EngineConfig, rank: int, world: int, init_method: str, threads: int | None
    ) -> None:
        if threads:
            torch.set_num_threads(threads)
        dist.init_process_group(
            _backend(config), init_method=init_method, rank=rank, world_size=world, timeout=TIMEOUT
        )
        self.runner = tp.follower_runner(config, tp.TPContext(rank, world))

    def run(self) -> int:
        steps = tp.follow(self.runner)
        dist.destroy_process_group()
        return steps


@dataclass
class TensorParallelGroup:
    workers: list
    loops: list  # ObjectRefs of the followers' run(); they resolve once rank 0 says stop

    def stop(self, engine: Engine, timeout_s: float = 10.0) -> None:
        """Call after the engine stopped stepping."""
        engine.runner.stop()
        ray.wait(self.loops, num_returns=len(self.loops), timeout=timeout_s)
        dist.destroy_process_group()
        for worker in self.workers:
            ray.kill(worker)


def start(config: EngineConfig, world: int, threads: int | None = None, cpus_per_shard: float = 1.0):
    """Start `world - 1` shard workers, then build the engine as rank 0; returns (engine, group)."""
    pg = ray.util.get_current_placement_group()
    if pg is None:
        raise RuntimeError("tensor_parallel_size > 1 needs the replica to run in a placement group")
    init_method = f"tcp://{ray.util.get_node_ip_address()}:{_free_port()}"
    gpu = 1 if config.device.startswith("cuda") else 0
    workers = [
        ShardWorker.options(
            num_cpus=cpus_per_shard,
            num_gpus=gpu,
            scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=rank),
        ).remote(config, rank, world, init_method, threads)
        for rank in range(1, world)
    ]
    # Queued behind each worker's __init__: the followers follow as soon as their shard is loaded.
    loops = [w.run.remote() for w in workers]
    try:
        dist.init_process_group(
            _backend(config), init_method=init_method, rank=0, world_size=world, timeout=TIMEOUT
        )
        engine = Engine(config, tp=tp.TPContext(0, world))
    except BaseException:
        # Followers blocked in a collective would wait out the timeout; end them with the replica.
        for worker in workers:
            ray.kill(worker)
        if dist.is_initialized():
            dist.destroy_process_group()
        raise
    return engine, TensorParallelGroup(workers, loops)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]
