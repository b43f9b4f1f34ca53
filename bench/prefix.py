"""Prefix caching: TTFT and throughput with the cache off and on, side by side in one run.

Two workloads of the same shape: `shared_system`, where every request is one system prompt followed
by its own user turn (chat traffic), and `no_reuse`, the control, where every request's prompt is its
own held-out text of the same length (nothing to reuse: what caching costs when it cannot help).
Requests run closed-loop at a fixed concurrency through the offline engine: a new one is admitted
as soon as one finishes, and TTFT is from its admission to its first token. Each repeat runs every
(workload, cache) pair in rotating order, from an empty cache, so drift on a noisy machine hits both
modes alike; the table gives the mean over repeats and the noise band (min to max over repeats).
Greedy decoding: both modes must produce the same tokens, and the run checks that they do.

    python bench/prefix.py --model models/target [--drafter ngram] [--repeats 3]
    python bench/prefix.py --model models/target --quick     # a smoke run: tiny settings

Writes bench/results/prefix.json and bench/results/prefix.md.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections import deque
from pathlib import Path

import torch
from transformers import AutoTokenizer

from drafter_service.demo.corpus import heldout_prompts
from dspark import SamplingParams
from dspark.config import EngineConfig
from dspark.engine import Engine

RESULTS = Path(__file__).parent / "results"
MODES = ("cache_off", "cache_on")
WORKLOADS = ("shared_system", "no_reuse")


def workloads(tokenizer, requests: int, system_tokens: int, user_tokens: int) -> dict[str, list[list[int]]]:
    """Token-id prompts of system_tokens + user_tokens each: one shared system prompt, or none."""
    texts = heldout_prompts("code", 2 * requests + 1, system_tokens + user_tokens, tokenizer)
    if len(texts) < 2 * requests + 1:
        raise SystemExit(f"the held-out corpus gave {len(texts)} prompts, {2 * requests + 1} needed")
    ids = [tokenizer.encode(t, add_special_tokens=False) for t in texts]
    # Held-out files often open alike (a docstring, a license line): a tag of its own at the start of
    # each control prompt makes sure its first page is unlike any other prompt's.
    tags = [tokenizer.encode(f"# request {i}\n", add_special_tokens=False) for i in range(requests)]
    system = ids[0][:system_tokens]
    return {
        "shared_system": [system + p[:user_tokens] for p in ids[1 : requests + 1]],
        "no_reuse": [(tag + p)[: system_tokens + user_tokens] for tag, p in zip(tags, ids[requests + 1 :])],
    }


def run(engine: Engine, prompts: list[list[int]], params: SamplingParams, concurrency: int) -> dict:
    """Closed loop at `concurrency`, from an empty cache; TTFT from admission to the first token."""
    engine.pages.clear_cache()
    before = engine.stats.to_dict()
    pending, admitted, first, outputs = deque(enumerate(prompts)), {}, {}, {}
    start = time.perf_counter()
    while pending or engine.has_unfinished():
        while pending and len(engine.seqs) < concurrency:
            i, prompt = pending.popleft()
            engine.add_request(prompt, params, request_id=str(i))
            admitted[i] = time.perf_counter()
        for out in engine.step():
            i = int(out.request_id)
            if out.token_ids and i not in first:
                first[i] = time.perf_counter()
            if out.finished:
                outputs[i] = out
    wall = time.perf_counter() - start
    after = engine.stats.to_dict()
    ttft_ms = sorted(1e3 * (first[i] - admitted[i]) for i in admitted)
    generated = sum(len(o.token_ids) for o in outputs.values())
    prompt_tokens = after["prompt_tokens"] - before["prompt_tokens"]
    return {
        "ttft_ms_mean": statistics.mean(ttft_ms),
        "ttft_ms_p50": ttft_ms[len(ttft_ms) // 2],
        "ttft_ms_p90": ttft_ms[min(len(ttft_ms) - 1, int(0.9 * len(ttft_ms)))],
        "throughput_tok_s": generated / wall,
        "wall_s": wall,
        "cached_prompt_fraction": (after["cached_prompt_tokens"] - before["cached_prompt_tokens"])
        / prompt_tokens,
        "prefill_tokens": after["prefill_tokens"] - before["prefill_tokens"],
        "outputs": [outputs[i].token_ids for i in range(len(prompts))],
    }


def band(values: list[float]) -> dict:
    return {
        "mean": round(statistics.mean(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="models/target")
    parser.add_argument("--drafter", default="none")
    parser.add_argument("--drafter-model", default=None)
    parser.add_argument("--num-speculative-tokens", type=int, default=5)
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--system-tokens", type=int, default=384)
    parser.add_argument("--user-tokens", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--max-num-batched-tokens", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="smoke run: tiny settings, results not written")
    args = parser.parse_args()
    if args.quick:
        args.requests, args.concurrency, args.system_tokens, args.user_tokens = 4, 2, 48, 8
        args.max_tokens, args.repeats, args.max_num_batched_tokens = 4, 1, 64
        torch.set_num_threads(1)  # a smoke run shares the machine

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    prompts = workloads(tokenizer, args.requests, args.system_tokens, args.user_tokens)
    options = dict(
        model=args.model,
        drafter=args.drafter,
        drafter_model=args.drafter_model,
        num_speculative_tokens=args.num_speculative_tokens,
        max_num_seqs=args.concurrency,
        max_num_batched_tokens=args.max_num_batched_tokens,
        kv_cache_memory_mb=128,
        max_model_len=args.system_tokens + args.user_tokens + args.max_tokens + 1,
        cost_table_profile="coarse" if args.quick else "full",
    )
    engines = {
        mode: Engine(EngineConfig(**options, enable_prefix_caching=mode == "cache_on")) for mode in MODES
    }
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    for engine in engines.values():  # warm-up: first-call allocations and lazy imports
        run(engine, prompts["no_reuse"][:1], params, 1)

    runs: dict[str, dict[str, list[dict]]] = {w: {m: [] for m in MODES} for w in WORKLOADS}
    pairs = [(w, m) for w in WORKLOADS for m in MODES]
    for rep in range(args.repeats):
        shift = rep % len(pairs)
        for workload, mode in pairs[shift:] + pairs[:shift]:
            runs[workload][mode].append(run(engines[mode], prompts[workload], params, args.concurrency))
            print(f"repeat {rep + 1}/{args.repeats} {workload} {mode} done", file=sys.stderr)

    results, summary = {}, {}
    for workload in WORKLOADS:
        results[workload] = {}
        for mode in MODES:
            reps = runs[workload][mode]
            results[workload][mode] = {
                key: band([r[key] for r in reps])
                for key in (
                    "ttft_ms_mean",
                    "ttft_ms_p50",
                    "ttft_ms_p90",
                    "throughput_tok_s",
                    "cached_prompt_fraction",
                )
            } | {"prefill_tokens": reps[0]["prefill_tokens"]}
        off, on = results[workload]["cache_off"], results[workload]["cache_on"]
        identical = all(
            a == b
            for r_off, r_on in zip(runs[workload]["cache_off"], runs[workload]["cache_on"])
            for a, b in zip(r_off["outputs"], r_on["outputs"])
        )
        summary[workload] = {
            "ttft_speedup": round(off["ttft_ms_mean"]["mean"] / on["ttft_ms_mean"]["mean"], 3),
            "throughput_ratio": round(on["throughput_tok_s"]["mean"] / off["throughput_tok_s"]["mean"], 3),
            "prefill_tokens_saved": 1 - on["prefill_tokens"] / off["prefill_tokens"],
            "greedy_outputs_identical": identical,
        }

    target = engines["cache_off"]
    result = {
        "command": "python bench/prefix.py " + " ".join(sys.argv[1:]),
        "machine": {
            "cpu_threads": torch.get_num_threads(),
            "platform": platform.platform(),
            "torch": torch.__version__,
        },
        "model": {"path": args.model, "parameters": sum(p.numel() for p in target.model.parameters())},
        "workload": {
            "requests": args.requests,
            "concurrency": args.concurrency,
            "system_tokens": args.system_tokens,
            "user_tokens": args.user_tokens,
            "max_tokens": args.max_tokens,
            "max_num_batched_tokens": args.max_num_batched_tokens,
            "kv_page_size": target.config.kv_page_size,
            "drafter": args.drafter,
            "repeats": args.repeats,
            "greedy": True,
        },
        "results": results,
        "summary": summary,
    }
    lines = [
        "# Prefix caching: TTFT and throughput, cache off vs on",
        "",
        f"`{result['command']}` — {result['model']['parameters'] / 1e6:.1f}M-parameter target, "
        f"{args.requests} requests of {args.system_tokens} + {args.user_tokens} prompt tokens, "
        f"{args.max_tokens} new tokens each, closed loop at concurrency {args.concurrency}, drafter "
        f"`{args.drafter}`, {args.repeats} repeats (mean, and min-max over repeats).",
        "",
        "| workload | cache | TTFT mean ms | TTFT p90 ms | throughput tok/s | prompt cached |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for workload in WORKLOADS:
        for mode in MODES:
            r = results[workload][mode]
            lines.append(
                f"| {workload} | {mode.removeprefix('cache_')} | {_cell(r['ttft_ms_mean'])} | "
                f"{_cell(r['ttft_ms_p90'])} | {_cell(r['throughput_tok_s'])} | "
                f"{100 * r['cached_prompt_fraction']['mean']:.0f}% |"
            )
    lines += [
        "",
        "| workload | TTFT speedup | throughput on/off | prefill saved | greedy identical |",
        "|---|---:|---:|---:|---|",
    ]
    for workload, s in summary.items():
        lines.append(
            f"| {workload} | {s['ttft_speedup']:.2f}x | {s['throughput_ratio']:.2f}x | "
            f"{100 * s['prefill_tokens_saved']:.0f}% | {s['greedy_outputs_identical']} |"
        )
    lines.append("")
    text = "\n".join(lines)
    print(text)
    if not all(s["greedy_outputs_identical"] for s in summary.values()):
        raise SystemExit("greedy outputs differ between cache off and on")
    if args.quick:
        return  # a smoke run's figures mean nothing: the committed results stay
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "prefix.json").write_text(json.dumps(result, indent=2) + "\n")
    (RESULTS / "prefix.md").write_text(text)


def _cell(b: dict) -> str:
    return f"{b['mean']:.1f} ({b['min']:.1f}-{b['max']:.1f})"


if __name__ == "__main__":
    main()
