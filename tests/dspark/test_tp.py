"""Tensor parallelism: greedy output of a 2-way sharded target equals the plain target's (gloo, CPU)."""

from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from dspark import LLM, EngineConfig, SamplingParams, tp

PROMPTS = ["def wrap(text, width):", "import bisect\n", "class TextWrapper:\n    "]
OPTIONS = dict(drafter="ngram", num_speculative_tokens=4, num_kv_pages=64)
PARAMS = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


def _rank(rank: int, world: int, init_method: str, model_dirs: list[str], out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
    results = {}
    for model in model_dirs:
        if rank == 0:
            llm = LLM(model, **OPTIONS)
            tp.shard_engine(llm.engine, world)
            results[model] = [o.token_ids for o in llm.generate(PROMPTS, PARAMS)]
            llm.engine.runner.stop()
        else:
            config = EngineConfig(model=model, **OPTIONS)
            tp.follow(tp.follower_runner(config, OPTIONS["num_kv_pages"], rank, world))
    if rank == 0:
        with open(out, "w") as f:
            json.dump(results, f)
    # Both ranks reach here before either tears gloo down: an early exit of one peer can abort the
    # other inside gloo's transport threads ("terminate called without an active exception").
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.slow
def test_two_way_tensor_parallel_greedy_equals_plain(qwen3_dir, llama_dir, tmp_path):
    models = [str(qwen3_dir), str(llama_dir)]  # llama has biases: row-parallel bias added once
    out = tmp_path / "tp.json"
    mp.spawn(_rank, args=(2, f"file://{tmp_path}/rendezvous", models, str(out)), nprocs=2, join=True)
    sharded = json.loads(out.read_text())
    for model in models:
        plain = [o.token_ids for o in LLM(model, **OPTIONS).generate(PROMPTS, PARAMS)]
        assert sharded[model] == plain, model


def test_shard_model_splits_heads_and_mlp(qwen3_dir):
    from dspark.checkpoint import load_checkpoint
    from dspark.model import CausalLM

    model = CausalLM.from_checkpoint(load_checkpoint(qwen3_dir, load_tokenizer=False))
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    q_rows, mlp_rows = attn.q_proj.weight.shape[0], mlp.gate_proj.weight.shape[0]
    first_q = attn.q_proj.weight[: q_rows // 2].clone()
    tp.shard_model(model, rank=0, world=2)
    assert attn.q_proj.weight.shape[0] == q_rows // 2 and torch.equal(attn.q_proj.weight, first_q)
    assert mlp.gate_proj.weight.shape[0] == mlp_rows // 2
    assert mlp.down_proj.weight.shape[1] == mlp_rows // 2
    assert attn.num_kv_heads == 1
    with pytest.raises(ValueError, match="num_key_value_heads"):
        tp.shard_model(CausalLM.from_checkpoint(load_checkpoint(qwen3_dir, load_tokenizer=False)), 0, 4)
