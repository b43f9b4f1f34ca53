"""Tensor parallelism: each rank reads and holds only its shard, greedy output of a 2-way sharded
engine equals the plain engine's (gloo, CPU), and the SPS table is profiled and cached per TP size."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from dspark import EngineConfig, SamplingParams, tp
from dspark.checkpoint import load_checkpoint, model_config_from_hf
from dspark.cost_table import ProfileShape, cache_path, fingerprint
from dspark.engine import Engine
from dspark.model import CausalLM

# A shared system prompt of several KV pages: with prefix caching on (the default), the later
# requests reuse the pages the first one committed, on every rank under the same page ids.
SYSTEM = "class TextWrapper:\n    def __init__(self, width=70, initial_indent='', subsequent_indent=''):\n"
PROMPTS = [SYSTEM + p for p in ("def wrap(text, width):", "import bisect\n", "class TextWrapper:\n    ")]
OPTIONS = dict(
    drafter="ngram",
    num_speculative_tokens=4,
    num_kv_pages=64,
    max_num_seqs=4,
    max_num_batched_tokens=48,
    cost_table_profile="coarse",
)
PARAMS = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


def generate(engine: Engine) -> list[list[int]]:
    ids = [engine.add_request(p, PARAMS) for p in PROMPTS]
    done = {}
    while engine.has_unfinished():
        done.update({o.request_id: o.token_ids for o in engine.step() if o.finished})
    return [done[i] for i in ids]


def _lead(config: EngineConfig, world: int) -> dict:
    """Rank 0: the engine, its SPS table profiled on the shards, and greedy output; counts forwards."""
    engine = Engine(config, tp=tp.TPContext(0, world))
    broadcast, sent = engine.runner.forward, []
    engine.runner.forward = lambda *args: sent.append(1) or broadcast(*args)
    table = engine.load_cost_table()  # the follower runs each profiled forward in lockstep
    result = {
        "tokens": generate(engine),
        "table": json.loads(table.path.read_text())["fingerprint"]["engine"],
        "kv_heads": engine.runner.kv.k[0].shape[1],
        "forwards": len(sent),
        "cached_prompt_tokens": engine.stats.cached_prompt_tokens,
    }
    engine.runner.stop()
    return result


def _rank(rank: int, world: int, init_method: str, model_dirs: list[str], cache: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
    results = {}
    for model in model_dirs:
        config = EngineConfig(model=model, cost_table_dir=cache, **OPTIONS)
        if rank == 0:
            results[model] = _lead(config, world)
        else:
            results[model] = {"forwards": tp.follow(tp.follower_runner(config, tp.TPContext(rank, world)))}
    Path(f"{out}.{rank}").write_text(json.dumps(results))
    tp.leave_rank(Path(f"{out}.{rank}.past_barrier"))  # a CI run saw SIGABRT at teardown after the work


def spawn_ranks(world: int, args: tuple, out: Path) -> None:
    """Run `_rank` on `world` processes; a rank that aborts after the final barrier has done its work
    (its marker says so) and does not fail the run, any other failure does."""
    try:
        mp.spawn(_rank, args=(world, *args), nprocs=world, join=True)
    except mp.ProcessExitedException as exc:
        done = all(Path(f"{out}.{r}.past_barrier").exists() for r in range(world))
        if not (done and exc.signal_name == "SIGABRT"):
            raise


@pytest.mark.slow
def test_two_way_tensor_parallel_greedy_equals_plain(qwen3_dir, llama_dir, tmp_path):
    models = [str(qwen3_dir), str(llama_dir)]  # llama has biases: row-parallel bias added once
    out, cache = tmp_path / "tp", str(tmp_path / "cache")
    spawn_ranks(2, (f"file://{tmp_path}/rendezvous", models, cache, str(out)), out)
    lead, follower = (json.loads(Path(f"{out}.{r}").read_text()) for r in (0, 1))
    for model in models:
        config = EngineConfig(model=model, cost_table_dir=cache, **OPTIONS)
        plain = Engine(config)  # TP=1: TPContext() is the engine's default, the same load path
        uncached = Engine(replace(config, enable_prefix_caching=False))
        assert lead[model]["tokens"] == generate(plain) == generate(uncached), model
        assert lead[model]["cached_prompt_tokens"] == plain.stats.cached_prompt_tokens > 0
        assert lead[model]["kv_heads"] == plain.runner.kv.k[0].shape[1] // 2  # its own heads only
        # The follower ran every forward rank 0 ran: the profile's and the generation's.
        assert follower[model]["forwards"] == lead[model]["forwards"] > 0
        assert lead[model]["table"]["tensor_parallel_size"] == 2
        # The 2-way table sits in the same cache under its own key: the plain engine profiles anew.
        assert plain.load_cost_table().source == "profiled"
        assert plain.load_cost_table().source == "cache"


def test_cost_table_key_differs_by_tensor_parallel_size(qwen3_dir, tmp_path):
    shape = ProfileShape(
        max_tokens=8, max_seqs=2, gamma=2, context_len=16, page_size=8, dtype="float32", device="cpu"
    )
    one, two = (fingerprint(qwen3_dir, replace(shape, tensor_parallel_size=n)) for n in (1, 2))
    assert fingerprint(qwen3_dir, shape) == one and one != two
    assert cache_path(one, tmp_path) != cache_path(two, tmp_path)


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_each_rank_loads_exactly_its_slices(arch, qwen3_dir, llama_dir):
    ckpt = load_checkpoint(qwen3_dir if arch == "qwen3" else llama_dir, load_tokenizer=False)
    whole = dict(CausalLM.from_checkpoint(ckpt).named_parameters())
    for rank in (0, 1):
        shard = tp.load_shard(ckpt, tp.TPContext(rank, 2), torch.float32)
        attn = shard.model.layers[0].self_attn
        assert (attn.num_heads, attn.num_kv_heads) == (2, 1)
        params = dict(shard.named_parameters())
        for name, full in whole.items():
            module = name.rpartition(".")[0].rpartition(".")[2]
            if module in tp.COLUMN_PARALLEL:
                expected = full.chunk(2, 0)[rank]
            elif module in tp.ROW_PARALLEL and name.endswith("weight"):
                expected = full.chunk(2, 1)[rank]
            elif module in tp.ROW_PARALLEL and rank:
                assert name not in params  # a row-parallel bias joins the all-reduced sum once
                continue
            else:
                expected = full
            assert torch.equal(params[name], expected), (rank, name)
    with pytest.raises(ValueError, match="num_key_value_heads"):
        tp.load_shard(ckpt, tp.TPContext(0, 4), torch.float32)


def test_only_rank_zero_runs_an_engine(qwen3_dir):
    with pytest.raises(ValueError, match="follow"):
        Engine(EngineConfig(model=str(qwen3_dir)), tp=tp.TPContext(1, 2))
    with pytest.raises(ValueError, match="rank 2"):
        tp.TPContext(2, 2)


def build_large_qwen3(directory: Path) -> Path:
    """A random bf16 Qwen3 of ~60 MB whose weights are almost all in sharded linears."""
    from safetensors.torch import save_file
    from transformers import Qwen3Config

    hf = Qwen3Config(
        vocab_size=512,
        hidden_size=512,
        intermediate_size=2048,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=64,
        max_position_embeddings=512,
        tie_word_embeddings=True,
    )
    hf.save_pretrained(directory)
    with torch.device("meta"):
        shapes = {
            k: t.shape for k, t in CausalLM(model_config_from_hf(hf), torch.empty(32)).state_dict().items()
        }
    gen = torch.Generator().manual_seed(0)
    weights = {
        k: (torch.randn(s, generator=gen) * 0.02).to(torch.bfloat16)
        for k, s in shapes.items()
        if k != "lm_head.weight"
    }
    save_file(weights, str(directory / "model.safetensors"))
    return directory


@pytest.mark.slow
def test_two_way_rank_loads_half_the_sharded_weights(tmp_path):
    model_dir = build_large_qwen3(tmp_path)
    probe = Path(__file__).with_name("shard_memory.py")
    # Rank 0 of TP=1 and of TP=2, each in a fresh process (rank 1 reads as much as rank 0).
    procs = [
        subprocess.Popen(
            [sys.executable, str(probe), str(model_dir), "0", str(world)], stdout=subprocess.PIPE, text=True
        )
        for world in (1, 2)
    ]
    full, half = (json.loads(proc.communicate(timeout=120)[0]) for proc in procs)
    assert [proc.returncode for proc in procs] == [0, 0]
    assert half["read_sharded_bytes"] * 2 == full["read_sharded_bytes"]  # no biases: exactly half
    assert half["read_whole_bytes"] == full["read_whole_bytes"]  # embeddings, norms: whole
    # Nothing was read beyond what the shard keeps.
    assert half["param_bytes"] == half["read_sharded_bytes"] + half["read_whole_bytes"]
    assert 0.45 <= half["rss_anon_growth_bytes"] / full["rss_anon_growth_bytes"] <= 0.55, (half, full)
    # Mapped file pages keep the peak above half (shard_memory.py); a whole load would reach 1.
    assert half["peak_rss_growth_bytes"] / full["peak_rss_growth_bytes"] < 0.85, (half, full)
    print(json.dumps({"tp1": full, "tp2": half}))  # the figures, for -s
