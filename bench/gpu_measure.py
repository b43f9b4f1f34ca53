"""Measure what a replica's steps cost on an accelerator: the data behind a measured profile for sim/.

Builds a target of a published shape with random weights (a step's time depends on the shapes, not on the
values) and a DSpark drafter of the paper's shape for it, then measures with the engine itself:
- SPS(B), by the engine's own profiler (dspark/cost_table.py) as a served replica profiles it;
- decode sweeps of the target alone (drafter none) at several concurrencies and prompt lengths;
- drafting sweeps (DSpark drafter, fixed block: every round drafts and verifies gamma tokens, draft gate
  off) at several concurrencies;
each sweep point timed by the engine's own counters over a window of decode steps after every request
finished its prefill. bench/gpu_profile.py derives the simulator's profile from the JSON this writes.
Acceptance is not measured here: random weights accept nothing; the profile takes it from the paper.

    python bench/gpu_measure.py --device cuda --dtype bfloat16 --out gpu_measurement.json
    python bench/gpu_measure.py --shape tiny --device cpu --dtype float32 --quick --out /tmp/m.json
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import platform
import shutil
import sys
import tempfile
import time
import traceback
from dataclasses import asdict
from pathlib import Path

import torch

from dspark import EngineConfig, SamplingParams
from dspark.engine import Engine
from dspark.kv_cache import KVCache
from dspark.sequence import Status

# Published shapes (the models' config.json on their hubs, copied by hand; nothing is downloaded).
QWEN3_4B = dict(
    vocab_size=151936,
    hidden_size=2560,
    intermediate_size=9728,
    num_hidden_layers=36,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    max_position_embeddings=40960,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
)
SHAPES = {
    "qwen3-4b": QWEN3_4B,
    "qwen3-8b": {**QWEN3_4B, "hidden_size": 4096, "intermediate_size": 12288, "tie_word_embeddings": False},
    # For the CPU dry run in the tests: the same code path in seconds.
    "tiny": {
        **QWEN3_4B,
        "vocab_size": 512,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 6,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "max_position_embeddings": 4096,
        "rope_theta": 10000.0,
    },
}
# The paper's drafter: 2 block layers over 5 fused target layers, Markov rank 256, confidence head.
DRAFT_LAYERS, FUSED_LAYERS, MARKOV_RANK = 2, 5, 256


def build_target(directory: Path, shape: str, dtype: torch.dtype, device: str) -> Path:
    """A Qwen3 checkpoint of `shape` with random weights, written as transformers writes one."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(**SHAPES[shape], bos_token_id=0, eos_token_id=1)
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3ForCausalLM(config).to(dtype)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    build_drafter(directory, model, gamma=7)
    del model
    return directory


def fused_layers(num_layers: int, count: int = FUSED_LAYERS) -> list[int]:
    """`count` target layers spread from shallow to deep, never the last (docs: DSpark's context fusion)."""
    last = num_layers - 2
    count = min(count, last + 1)
    return sorted({round(i * last / max(1, count - 1)) for i in range(count)})


def build_drafter(target_dir: Path, target, gamma: int) -> Path:
    """A DSpark drafter of the paper's shape for `target` (random weights), where the engine finds it."""
    from transformers import AutoConfig

    from drafter_service.models.checkpoint import build_drafter as new_drafter
    from drafter_service.models.checkpoint import save_drafter
    from drafter_service.models.config import DrafterConfig
    from drafter_service.models.paths import default_drafter_dir

    t = AutoConfig.from_pretrained(target_dir)
    cfg = DrafterConfig.for_target(
        t,
        "dspark",
        target_layer_ids=fused_layers(t.num_hidden_layers),
        mask_token_id=t.vocab_size - 1,
        num_hidden_layers=DRAFT_LAYERS,
        block_size=gamma,
        markov_rank=min(MARKOV_RANK, t.hidden_size // 4),
        markov_head_type="vanilla",
        enable_confidence_head=True,
        confidence_head_with_markov=True,
    )
    embed, head = target.get_input_embeddings(), target.get_output_embeddings()
    with torch.device(embed.weight.device):
        drafter = new_drafter(cfg, embed, head).to(embed.weight.dtype)
    out = default_drafter_dir(target_dir, "dspark")
    save_drafter(drafter, out)
    return out


def engine_for(target: Path, args: argparse.Namespace, drafter: str) -> Engine:
    return Engine(
        EngineConfig(
            model=str(target),
            drafter=drafter,
            num_speculative_tokens=args.gamma,
            scheduler="fixed",  # every round verifies its whole block: the drafter's cost at every step
            draft_gate=False,
            dtype=args.dtype,
            device=args.device,
            num_kv_pages=args.kv_pages,
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            enable_prefix_caching=False,  # random prompts share nothing; keep every prefill real
            cost_table_dir=str(args.work / "sps"),
            cost_table_profile="coarse" if args.quick else "full",
            cost_table_ema=0.0,
        )
    )


COUNTERS = ("steps", "forward_tokens", "rounds", "generated_tokens", "drafted_tokens", "accepted_tokens")
TIMERS = ("step_time_s", "forward_time_s", "draft_time_s")


def sweep_point(engine: Engine, concurrency: int, prompt_tokens: int, steps: int, seed: int) -> dict:
    """`concurrency` requests of random prompts; the counters over `steps` decode steps after prefill."""
    gen = torch.Generator().manual_seed(seed)
    vocab = engine.model_config.vocab_size
    # Enough tokens that no request finishes inside the window, though the first ones decode while later
    # ones still prefill (chunks of max_num_batched_tokens).
    prefill_bound = math.ceil(concurrency * prompt_tokens / engine.config.max_num_batched_tokens) + 4
    budget = (steps + prefill_bound) * (engine.gamma + 1) + 8
    params = SamplingParams(temperature=0, max_tokens=budget, ignore_eos=True)
    ids = [
        engine.add_request(torch.randint(2, vocab - 1, (prompt_tokens,), generator=gen).tolist(), params)
        for _ in range(concurrency)
    ]
    prefill_steps = 0
    while not all(rid in engine.seqs and engine.seqs[rid].status is Status.DECODE for rid in ids):
        engine.step()
        prefill_steps += 1
    for _ in range(2):  # the first decode steps of a new batch shape pay for allocations
        engine.step()
    before, wall = asdict(engine.stats), time.perf_counter()
    for _ in range(steps):
        engine.step()
    wall = time.perf_counter() - wall
    after = asdict(engine.stats)
    for rid in ids:
        engine.abort(rid)
    point = {k: after[k] - before[k] for k in COUNTERS + TIMERS}
    return {
        "concurrency": concurrency,
        "prompt_tokens": prompt_tokens,
        "prefill_steps": prefill_steps,
        "wall_s": wall,
        **point,
        "step_ms": 1e3 * point["step_time_s"] / max(1, point["steps"]),
        "draft_ms": 1e3 * point["draft_time_s"] / max(1, point["steps"]),
        "tokens_per_step": point["forward_tokens"] / max(1, point["steps"]),
    }


def sweep(engine: Engine, points: list[tuple[int, int]], steps: int, label: str, deadline: float) -> list:
    out = []
    for i, (concurrency, prompt) in enumerate(points):
        if time.monotonic() > deadline:
            print(f"[{label}] time budget spent: {len(points) - i} points skipped", flush=True)
            break
        p = sweep_point(engine, concurrency, prompt, steps, seed=i)
        out.append(p)
        print(
            f"[{label}] c={concurrency:4d} prompt={prompt:5d}: {p['step_ms']:8.2f} ms/step "
            f"(draft {p['draft_ms']:.2f}) {p['tokens_per_step']:7.1f} tok/step",
            flush=True,
        )
    return out


def profile_table(engine: Engine) -> dict:
    """SPS(B) profiled afresh by the engine's own profiler, as a served replica profiles it."""
    started = time.monotonic()
    table = engine.load_cost_table(force=True)
    seconds = time.monotonic() - started
    print(f"gpu_measure: SPS profiled at {len(table.points)} points in {seconds:.0f}s", flush=True)
    return {**table.to_dict(), "profile_s": seconds, "shape": asdict(engine.cost_table_shape())}


def hardware(device: str) -> dict:
    info = {"torch": torch.__version__, "python": platform.python_version(), "host": platform.node()}
    if device.startswith("cuda"):
        free, total = torch.cuda.mem_get_info()
        info.update(device=torch.cuda.get_device_name(), memory_bytes=total, cuda=torch.version.cuda)
    else:
        info.update(device=platform.processor() or platform.machine(), threads=torch.get_num_threads())
    return info


def weight_bytes(target: Path) -> int:
    return sum(p.stat().st_size for p in target.glob("*.safetensors"))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="qwen3-4b", choices=sorted(SHAPES))
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--gamma", type=int, default=7)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--kv-pages", type=int, default=12288, help="KV pages of 16 the engines allocate")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 64, 128, 256])
    p.add_argument("--prompt-tokens", type=int, default=256)
    p.add_argument("--long-prompt-tokens", type=int, default=1024, help="plain sweep's second shape")
    p.add_argument("--long-concurrency", type=int, nargs="+", default=[16, 64])
    p.add_argument("--steps", type=int, default=24, help="decode steps timed per point")
    p.add_argument("--budget-s", type=float, default=300.0, help="seconds for the sweeps (both engines)")
    p.add_argument("--quick", action="store_true", help="coarse SPS profile (the tests' dry run)")
    p.add_argument("--work", type=Path, help="where checkpoints are built (default: a temp dir)")
    p.add_argument("--out", type=Path, required=True)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(f"gpu_measure: torch {torch.__version__} sees no CUDA device")
        return 2
    own_work = args.work is None  # a temp dir of ours is removed at the end; a given one is kept
    args.work = args.work or Path(tempfile.mkdtemp(prefix="dspark-gpu-"))
    start = time.monotonic()
    dtype = getattr(torch, args.dtype)
    target = build_target(args.work / "target", args.shape, dtype, args.device)
    built_s = time.monotonic() - start
    print(f"gpu_measure: {args.shape} target and drafter built in {built_s:.0f}s", flush=True)
    result = {
        "command": " ".join(["python -m bench.gpu_measure", *(sys.argv[1:] if argv is None else argv)]),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "shape": {"name": args.shape, **SHAPES[args.shape]},
        "drafter": {
            "layers": DRAFT_LAYERS,
            "fused_target_layers": fused_layers(SHAPES[args.shape]["num_hidden_layers"]),
        },
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "hardware": hardware(args.device),
        "weight_bytes": weight_bytes(target),
        "kv_bytes_per_token": KVCache.bytes_per_token(
            *(SHAPES[args.shape][k] for k in ("num_hidden_layers", "num_key_value_heads", "head_dim")), dtype
        ),
        "build_s": built_s,
    }

    deadline = time.monotonic() + args.budget_s  # restarted once the table is profiled
    try:  # a drafter failure on this device is a result too: recorded, and the plain sweeps still run
        drafting = engine_for(target, args, "dspark")
        result["sps_table"] = profile_table(drafting)
        if args.device.startswith("cuda"):
            result["peak_memory_bytes_drafting"] = torch.cuda.max_memory_allocated()
        deadline = time.monotonic() + args.budget_s  # for the sweeps, both engines' together
        points = [(c, args.prompt_tokens) for c in args.concurrency]
        result["draft_sweep"] = sweep(drafting, points, args.steps, "draft", deadline)
    except Exception:
        result["draft_error"] = traceback.format_exc()
        print(result["draft_error"], flush=True)
    drafting = None
    gc.collect()  # the engine's cycles hold its KV cache and weights: free them before the next engine
    if args.device.startswith("cuda"):
        torch.cuda.empty_cache()

    plain = engine_for(target, args, "none")
    if "sps_table" not in result:
        result["sps_table"] = profile_table(plain)
        deadline = time.monotonic() + args.budget_s
    points = [(c, args.prompt_tokens) for c in args.concurrency]
    points += [(c, args.long_prompt_tokens) for c in args.long_concurrency]
    result["engine_sweep"] = sweep(plain, points, args.steps, "plain", deadline)
    result["wall_s"] = time.monotonic() - start
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"gpu_measure: wrote {args.out} after {result['wall_s']:.0f}s", flush=True)
    if own_work:
        shutil.rmtree(args.work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
