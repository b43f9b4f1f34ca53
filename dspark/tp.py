"""Tensor parallelism as a transformation of the plain model, in the style of gpt-fast's tp.py.

`shard_model` slices every attention layer by heads and every MLP by its intermediate size: q/k/v and
gate/up keep a slice of their output features (column parallel), o_proj and down_proj the matching
slice of their input features (row parallel) and all-reduce their partial sums. Embeddings, norms and
lm_head stay whole, so after each all-reduce every rank holds the plain model's residual stream:
hidden-state taps and logits read on rank 0 are the unsharded model's, up to summation order.

Rank 0 runs the engine (scheduler, drafter, sampling) with a `ShardedRunner` that broadcasts each
step's inputs; the other ranks `follow`. Placing the processes is the caller's business (Ray actors in
deployments/tensor_parallel.py; plain processes in tests). Works with any torch.distributed backend
(gloo on CPU, NCCL on GPU).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from dspark.checkpoint import load_checkpoint
from dspark.config import EngineConfig
from dspark.engine import Engine
from dspark.kv_cache import KVCache
from dspark.model import CausalLM
from dspark.runner import ForwardItem, ForwardResult, ModelRunner

KEEPALIVE = "keepalive"


def _keep(linear: nn.Linear, dim: int, rank: int, world: int) -> None:
    """Keep this rank's slice of a Linear along its output (dim 0) or input (dim 1) features."""
    weight = linear.weight.detach()
    if weight.shape[dim] % world:
        raise ValueError(f"cannot split {tuple(weight.shape)} {world} ways along dim {dim}")
    linear.weight = nn.Parameter(weight.chunk(world, dim)[rank].clone(), requires_grad=False)
    if dim == 0:
        linear.out_features = linear.weight.shape[0]
        if linear.bias is not None:
            linear.bias = nn.Parameter(linear.bias.detach().chunk(world)[rank].clone(), requires_grad=False)
    else:
        linear.in_features = linear.weight.shape[1]
        if linear.bias is not None and rank != 0:
            linear.bias = None  # row parallel: the bias joins the sum once, on rank 0


def _all_reduce_output(linear: nn.Linear, group) -> None:
    def hook(module, inputs, output):
        dist.all_reduce(output, group=group)
        return output

    linear.register_forward_hook(hook)


def shard_model(model: CausalLM, rank: int, world: int, group=None) -> CausalLM:
    """Turn `model` into rank `rank`'s shard of a `world`-way tensor-parallel model, in place."""
    cfg = model.config
    for name, n in (
        ("num_attention_heads", cfg.num_heads),
        ("num_key_value_heads", cfg.num_kv_heads),
        ("intermediate_size", cfg.intermediate_size),
    ):
        if n % world:
            raise ValueError(f"tensor_parallel_size={world} does not divide {name}={n}")
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        # Contiguous head slices keep each query head with its GQA key/value head.
        for linear in (attn.q_proj, attn.k_proj, attn.v_proj, mlp.gate_proj, mlp.up_proj):
            _keep(linear, 0, rank, world)
        for linear in (attn.o_proj, mlp.down_proj):
            _keep(linear, 1, rank, world)
            _all_reduce_output(linear, group)
        attn.num_heads, attn.num_kv_heads = cfg.num_heads // world, cfg.num_kv_heads // world
    return model


def shard_kv_cache(engine_config: EngineConfig, model: CausalLM, num_pages: int, world: int) -> KVCache:
    cfg = model.config
    return KVCache(
        cfg.num_layers,
        num_pages,
        engine_config.kv_page_size,
        cfg.num_kv_heads // world,
        cfg.head_dim,
        engine_config.torch_dtype,
        engine_config.device,
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


def shard_engine(engine: Engine, world: int, group=None) -> Engine:
    """Make a loaded engine rank 0 of `world`: shard its model, shrink its KV cache to its heads.

    The page count stays the engine's, so every rank pages the same slots and admission is unchanged.
    """
    shard_model(engine.model, 0, world, group)
    kv = shard_kv_cache(engine.config, engine.model, engine.pages.num_pages, world)
    engine.runner = ShardedRunner(
        engine.model, kv, engine.config.kv_page_size, engine.config.device, group=group
    )
    return engine


def follower_runner(
    engine_config: EngineConfig, num_pages: int, rank: int, world: int, group=None
) -> ModelRunner:
    """Rank `rank` > 0: its shard of the target and its part of the KV cache (no tokenizer, no drafter)."""
    ckpt = load_checkpoint(engine_config.model, load_tokenizer=False)
    model = CausalLM.from_checkpoint(ckpt, engine_config.torch_dtype).to(engine_config.device)
    shard_model(model, rank, world, group)
    kv = shard_kv_cache(engine_config, model, num_pages, world)
    return ModelRunner(model, kv, engine_config.kv_page_size, engine_config.device)


@torch.inference_mode()
def follow(runner: ModelRunner, group=None) -> int:
    """Run every forward rank 0 broadcasts until it says stop; returns how many ran."""
    steps = 0
    while True:
        message = [None]
        dist.broadcast_object_list(message, src=0, group=group)
        if message[0] is None:
            return steps
        if message[0] != KEEPALIVE:
            runner.forward(*message[0])
        steps += 1
