"""Algorithm 1 on the forward alone against Algorithm 1 on the whole round (forward plus drafting,
EngineConfig.verify_counts_drafting: dspark/scheduler.py RoundRate), single stream, beside plain decoding
and the fixed block: tok/s, drafts verified and accepted per round, rounds the draft gate declined.

Four engines on one target, held-out code prompts one at a time, T=0 and T=1, repeats in alternating
order; the spread of plain's repeats is the noise band.

    python bench/round_rate.py --model models/target
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from anywhere
RESULTS = REPO / "bench" / "results"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=str(REPO / "models" / "target"))
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--prompt-tokens", type=int, default=96)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=RESULTS / "round_rate.json")
    args = p.parse_args(argv)

    from transformers import AutoTokenizer

    from drafter_service.demo.corpus import heldout_prompts
    from dspark import LLM, SamplingParams

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    prompts = heldout_prompts("code", args.prompts, args.prompt_tokens, tokenizer)

    def dspark(**options) -> LLM:
        return LLM(args.model, kv_cache_memory_mb=128, drafter="dspark", num_speculative_tokens=7, **options)

    engines = {
        "plain": LLM(args.model, kv_cache_memory_mb=128, scheduler="plain"),
        "scheduled_forward": dspark(scheduler="dspark", verify_counts_drafting=False),
        "scheduled_round": dspark(scheduler="dspark", verify_counts_drafting=True),
        "fixed": dspark(scheduler="fixed"),
    }
    rows = []
    for temperature in (0.0, 1.0):
        params = SamplingParams(temperature=temperature, max_tokens=args.new_tokens, ignore_eos=True, seed=1)
        for llm in engines.values():  # warm-up, and the draft gate's first measurements
            llm.generate(prompts[:1], params, use_tqdm=False)
        for repeat in range(args.repeats):
            order = list(engines) if repeat % 2 == 0 else list(reversed(engines))
            for name in order:
                llm = engines[name]
                before = llm.engine.stats.to_dict()
                start = time.perf_counter()
                tokens = sum(
                    len(o.token_ids) for p_ in prompts for o in llm.generate([p_], params, use_tqdm=False)
                )
                wall = time.perf_counter() - start
                after = llm.engine.stats.to_dict()
                delta = {
                    k: after[k] - before[k]
                    for k in ("rounds", "drafted_tokens", "accepted_tokens", "gated_rounds")
                }
                rounds = max(1, delta["rounds"])
                rows.append(
                    {
                        "temperature": temperature,
                        "repeat": repeat,
                        "method": name,
                        "tok_s": round(tokens / wall, 2),
                        "verified_per_round": round(delta["drafted_tokens"] / rounds, 3),
                        "accepted_per_round": round(delta["accepted_tokens"] / rounds, 3),
                        "gated_rounds": delta["gated_rounds"],
                    }
                )
                print(rows[-1], flush=True)
    summary = {}
    for temperature in (0.0, 1.0):
        mine = [r for r in rows if r["temperature"] == temperature]
        means = {
            (m, k): sum(r[k] for r in mine if r["method"] == m) / args.repeats
            for m in engines
            for k in ("tok_s", "verified_per_round")
        }
        plain = [r["tok_s"] for r in mine if r["method"] == "plain"]
        drafting = [m for m in engines if m != "plain"]
        summary[f"T{temperature:g}"] = {
            **{f"{m}_vs_plain": round(means[m, "tok_s"] / means["plain", "tok_s"], 3) for m in drafting},
            **{f"{m}_verified_per_round": round(means[m, "verified_per_round"], 2) for m in drafting},
            "noise_band_plain": round(max(plain) / min(plain) - 1, 3),
        }
    result = {
        "command": "python bench/round_rate.py " + " ".join(argv or sys.argv[1:]),
        "rows": rows,
        "summary": summary,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
