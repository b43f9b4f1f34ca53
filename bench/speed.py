"""Single-stream greedy decoding speed, side by side in one run.

Methods: `transformers` generate (the peer), our engine with plain decoding (drafter `none`) and with
n-gram drafting. Each repetition runs every method on every prompt in rotating order so drift on a
noisy machine hits all of them alike; results are ratios from the same run.

    python bench/speed.py --model models/target
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer

from drafter_service.demo.corpus import heldout_prompts
from dspark import LLM, SamplingParams

RESULTS = Path(__file__).parent / "results"


def hf_runner(model_dir: str, new_tokens: int):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()

    def run(prompt_ids: list[int]) -> list[int]:
        with torch.inference_mode():
            out = model.generate(
                torch.tensor([prompt_ids]),
                attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
                do_sample=False,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                pad_token_id=0,
            )
        return out[0, len(prompt_ids) :].tolist()

    return run, sum(p.numel() for p in model.parameters())


def engine_runner(model_dir: str, new_tokens: int, drafter: str, gamma: int):
    llm = LLM(model_dir, drafter=drafter, num_speculative_tokens=gamma, kv_cache_memory_mb=64)
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)

    def run(prompt_ids: list[int]) -> list[int]:
        return llm.generate([prompt_ids], params)[0].token_ids

    return run, llm


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="models/target")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=96)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--gamma", type=int, default=5)
    args = parser.parse_args()

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    prompts = [
        tokenizer.encode(p, add_special_tokens=False)
        for p in heldout_prompts("code", args.prompts, args.prompt_tokens, tokenizer)
    ]
    hf, num_params = hf_runner(args.model, args.new_tokens)
    plain, plain_llm = engine_runner(args.model, args.new_tokens, "none", args.gamma)
    ngram, ngram_llm = engine_runner(args.model, args.new_tokens, "ngram", args.gamma)
    methods = {"transformers_generate": hf, "dspark_plain": plain, "dspark_ngram": ngram}

    for run in methods.values():  # warm-up: first-call allocations and lazy imports
        run(prompts[0])
    for llm in (plain_llm, ngram_llm):
        llm.engine.stats.__init__()

    seconds = dict.fromkeys(methods, 0.0)
    tokens = dict.fromkeys(methods, 0)
    outputs: dict[str, list[list[int]]] = {m: [] for m in methods}
    names = list(methods)
    total = args.repeats * len(prompts) * len(names)
    with tqdm(total=total, desc="speed") as bar:
        for rep in range(args.repeats):
            for i, prompt in enumerate(prompts):
                shift = (rep + i) % len(names)
                for name in names[shift:] + names[:shift]:
                    start = time.perf_counter()
                    out = methods[name](prompt)
                    seconds[name] += time.perf_counter() - start
                    tokens[name] += len(out)
                    if rep == 0:
                        outputs[name].append(out)
                    bar.update(1)

    tok_s = {m: tokens[m] / seconds[m] for m in methods}
    plain_stats, ngram_stats = plain_llm.engine.stats.to_dict(), ngram_llm.engine.stats.to_dict()
    identical = {
        m: sum(a == b for a, b in zip(outputs[m], outputs["transformers_generate"])) for m in methods
    }
    result = {
        "command": "python bench/speed.py " + " ".join(sys.argv[1:]),
        "machine": {
            "cpu_threads": torch.get_num_threads(),
            "platform": platform.platform(),
            "torch": torch.__version__,
        },
        "model": {"path": args.model, "parameters": num_params},
        "workload": {
            "domain": "code (held-out stdlib files)",
            "prompts": len(prompts),
            "prompt_tokens": args.prompt_tokens,
            "new_tokens": args.new_tokens,
            "repeats": args.repeats,
            "gamma": args.gamma,
            "batch": 1,
            "greedy": True,
        },
        "tok_s": {m: round(v, 2) for m, v in tok_s.items()},
        "speedup_vs_transformers": {
            m: round(v / tok_s["transformers_generate"], 3) for m, v in tok_s.items()
        },
        "outputs_identical_to_transformers": {m: f"{identical[m]}/{len(prompts)}" for m in methods},
        "engine_overhead_fraction_batch1": plain_stats["overhead_fraction"],
        "engine_step_ms_p50_plain": plain_stats["step_ms_p50"],
        "ngram_mean_accept_length": ngram_stats["mean_accept_length"],
        "ngram_acceptance_rate": ngram_stats["acceptance_rate"],
        "ngram_overhead_fraction": ngram_stats["overhead_fraction"],
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "speed.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        "# Single-stream greedy decoding speed",
        "",
        f"`{result['command']}` — {num_params / 1e6:.1f}M-parameter target, {len(prompts)} held-out code "
        f"prompts of {args.prompt_tokens} tokens, {args.new_tokens} new tokens each, {args.repeats} repeats, "
        f"{torch.get_num_threads()} CPU threads.",
        "",
        "| method | tok/s | vs transformers | greedy output = transformers |",
        "|---|---:|---:|---:|",
    ]
    for m in methods:
        lines.append(
            f"| {m} | {tok_s[m]:.1f} | {result['speedup_vs_transformers'][m]:.2f}x | "
            f"{result['outputs_identical_to_transformers'][m]} |"
        )
    lines += [
        "",
        f"Engine overhead at batch 1 (step time outside the model forward and the drafter): "
        f"{100 * plain_stats['overhead_fraction']:.1f}% plain, "
        f"{100 * ngram_stats['overhead_fraction']:.1f}% n-gram; "
        f"plain step p50 {plain_stats['step_ms_p50']:.2f} ms.",
        f"N-gram drafting: tau = {ngram_stats['mean_accept_length']:.2f} tokens per verify round, "
        f"{100 * ngram_stats['acceptance_rate']:.0f}% of drafted tokens accepted.",
        "",
    ]
    (RESULTS / "speed.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
