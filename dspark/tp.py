"""Tensor parallelism as a transformation of the plain model, in the style of gpt-fast's tp.py.

`shard_model` slices every attention layer by heads and every MLP by its intermediate size: q/k/v and
gate/up keep a slice of their output features (column parallel), o_proj and down_proj the matching
slice of their input features (row parallel) and all-reduce their partial sums. Embeddings, norms and
lm_head stay whole, so after each all-reduce every rank holds the plain model's residual stream:
hidden-state taps and logits read on rank 0 are the unsharded model's, up to summation order.

No rank ever holds the whole model, so a model that fits no single device can still be served: a rank
builds the model on the meta device (no storage), shards that empty structure, then reads from the
safetensors files only the slices its shard holds, straight into the engine dtype on its device
(`load_shard`). Its KV cache holds its own key/value heads only.

Rank 0 runs the engine (`Engine(config, tp=TPContext(0, world))`: scheduler, drafter, sampling) with a
`ShardedRunner` that broadcasts each forward's inputs; the other ranks build `follower_runner` and
`follow`. The SPS cost table is therefore profiled on the sharded model, all ranks in lockstep.
Placing the processes and joining the group is the caller's business (Ray actors in
deployments/tensor_parallel.py; plain processes in tests). Works with any torch.distributed backend
(gloo on CPU, NCCL on GPU).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from dspark.checkpoint import Checkpoint, ModelConfig, load_checkpoint, read_weights
from dspark.config import EngineConfig
from dspark.kv_cache import KVCache
from dspark.model import CausalLM
from dspark.runner import ForwardItem, ForwardResult, ModelRunner

# Linears that keep a slice of their output features (weight rows and bias) ...
COLUMN_PARALLEL = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
# ... and those that keep the matching slice of their input features (weight columns), whose partial
# sums are all-reduced; their bias joins the sum once, on rank 0.
ROW_PARALLEL = ("o_proj", "down_proj")
KEEPALIVE = "keepalive"


@dataclass(frozen=True)
class TPContext:
    """This process's place in a tensor-parallel group (`group` None: the default process group)."""

    rank: int = 0
    world: int = 1
    group: object = None

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world:
            raise ValueError(f"rank {self.rank} is not in a group of {self.world}")


def _part(n: int, tp: TPContext, what: str) -> slice:
    """This rank's contiguous share of n features."""
    if n % tp.world:
        raise ValueError(f"tensor_parallel_size={tp.world} does not divide {what}={n}")
    size = n // tp.world
    return slice(tp.rank * size, (tp.rank + 1) * size)


def read_shard(tp: TPContext, name: str, lazy) -> torch.Tensor | None:
    """This rank's part of checkpoint tensor `name`, read from its lazy safetensors slice and no more."""
    module, _, kind = name.rpartition(".")
    module = module.rpartition(".")[2]
    if module in COLUMN_PARALLEL:
        return lazy[_part(lazy.get_shape()[0], tp, name)]
    if module in ROW_PARALLEL:
        if kind == "bias":
            return lazy[:] if tp.rank == 0 else None
        return lazy[:, _part(lazy.get_shape()[1], tp, name)]
    return lazy[:]


def _keep(linear: nn.Linear, dim: int, tp: TPContext) -> None:
    """Keep this rank's slice of a Linear along its output (dim 0) or input (dim 1) features.

    On a meta model this only reshapes; `load_shard` then fills in the slices read from disk.
    """
    part = _part(linear.weight.shape[dim], tp, f"{'out' if dim == 0 else 'in'}_features")
    weight = linear.weight.detach()  # clone: a loaded model must not keep the whole tensor alive
    linear.weight = nn.Parameter((weight[part] if dim == 0 else weight[:, part]).clone(), requires_grad=False)
    if dim == 0:
        linear.out_features = linear.weight.shape[0]
        if linear.bias is not None:
            linear.bias = nn.Parameter(linear.bias.detach()[part].clone(), requires_grad=False)
    else:
        linear.in_features = linear.weight.shape[1]
        if linear.bias is not None and tp.rank != 0:
            linear.bias = None


def _all_reduce_output(linear: nn.Linear, group) -> None:
    def hook(module, inputs, output):
        dist.all_reduce(output, group=group)
        return output

    linear.register_forward_hook(hook)


def shard_model(model: CausalLM, tp: TPContext) -> CausalLM:
    """Turn `model` (empty on the meta device, or loaded) into rank tp.rank's shard, in place."""
    if tp.world == 1:
        return model
    cfg = model.config
    for name, n in (
        ("num_attention_heads", cfg.num_heads),
        ("num_key_value_heads", cfg.num_kv_heads),
        ("intermediate_size", cfg.intermediate_size),
    ):
        _part(n, tp, name)  # contiguous head slices keep each query head with its GQA key/value head
    for name, module in model.named_modules():
        kind = name.rpartition(".")[2]
        if kind in COLUMN_PARALLEL:
            _keep(module, 0, tp)
        elif kind in ROW_PARALLEL:
            _keep(module, 1, tp)
            _all_reduce_output(module, tp.group)
    for layer in model.model.layers:
        layer.self_attn.num_heads = cfg.num_heads // tp.world
        layer.self_attn.num_kv_heads = cfg.num_kv_heads // tp.world
    return model


def load_shard(
    ckpt: Checkpoint, tp: TPContext, dtype: torch.dtype, device: torch.device | str = "cpu"
) -> CausalLM:
    """Rank tp.rank's shard: built empty at its sharded shapes, filled with only the slices it holds."""
    model = shard_model(CausalLM.on_meta(ckpt), tp)
    return model.load_weights(ckpt, read_weights(ckpt, dtype, device, partial(read_shard, tp)))


def rank_kv_cache(config: EngineConfig, cfg: ModelConfig, world: int = 1) -> KVCache:
    """This rank's KV cache: its own key/value heads, in `num_kv_pages` pages or as many as
    `kv_cache_memory_mb` (per rank) holds. The count follows from the configs alone, so every rank
    pages the same slots without asking rank 0."""
    kv_heads = cfg.num_kv_heads // world
    per_page = KVCache.bytes_per_token(cfg.num_layers, kv_heads, cfg.head_dim, config.torch_dtype)
    num_pages = config.num_kv_pages or max(
        1, config.kv_cache_memory_mb * 2**20 // (per_page * config.kv_page_size)
    )
    return KVCache(
        cfg.num_layers,
        num_pages,
        config.kv_page_size,
        kv_heads,
        cfg.head_dim,
        config.torch_dtype,
        config.device,
    )


class ShardedRunner(ModelRunner):
    """Rank 0's runner: every forward is first broadcast, so the other ranks run it in lockstep."""

    def __init__(self, *args, group=None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.group = group

    def forward(self, items: list[ForwardItem], tap_layers: tuple[int, ...] = ()) -> ForwardResult:
        dist.broadcast_object_list([(items, tap_layers)], src=0, group=self.group)
        return super().forward(items, tap_layers)

    def keepalive(self) -> None:
        """Between steps only: an idle group must not run into the collective timeout."""
        dist.broadcast_object_list([KEEPALIVE], src=0, group=self.group)

    def stop(self) -> None:
        """Release the followers; call once the engine has stopped stepping."""
        dist.broadcast_object_list([None], src=0, group=self.group)


def rank_runner(ckpt: Checkpoint, config: EngineConfig, tp: TPContext) -> ModelRunner:
    """This rank's shard of the target over its part of the KV cache; rank 0 of a group broadcasts."""
    model = load_shard(ckpt, tp, config.torch_dtype, config.device)
    kv = rank_kv_cache(config, ckpt.config, tp.world)
    if tp.rank == 0 and tp.world > 1:
        return ShardedRunner(model, kv, config.kv_page_size, config.device, group=tp.group)
    return ModelRunner(model, kv, config.kv_page_size, config.device)


def follower_runner(config: EngineConfig, tp: TPContext) -> ModelRunner:
    """Rank tp.rank > 0: its shard and its part of the KV cache (no tokenizer, no drafter)."""
    return rank_runner(load_checkpoint(config.model, load_tokenizer=False), config, tp)


@torch.inference_mode()
def follow(runner: ModelRunner, group=None) -> int:
    """Run every forward rank 0 broadcasts until it says stop; returns how many messages came."""
    steps = 0
    while True:
        message = [None]
        dist.broadcast_object_list(message, src=0, group=group)
        if message[0] is None:
            return steps
        if message[0] != KEEPALIVE:
            runner.forward(*message[0])
        steps += 1


def leave_rank(marker: Path) -> None:
    """End a rank process started for one job (mp.spawn) once its work is done: wait until every peer is
    done too (an early exit of one can abort the other inside gloo's transport threads), touch `marker`
    (past the final barrier: its caller may judge an abnormal exit after it as teardown's), tear the
    group down, and leave without the interpreter's teardown, where gloo's threads have aborted a
    finished rank ("terminate called without an active exception"). Does not return."""
    dist.barrier()
    marker.touch()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
