"""Does computing the block drafter in bf16 move its acceptance? The DSpark drafter at compute_dtype
float32 and bfloat16, side by side on the same held-out prompts (bench/accept.py's evaluation windows), at
temperature 0 and 1, block 7, two sampling seeds each: tau and per-position conditional acceptance.

Lossless either way (q is what each drafted token was drawn from, in any dtype): only acceptance, and so
speed, can move. At T=1 the seeds are the noise band: the same drafter under two seeds.

    python bench/accept_dtype.py --models models
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from anywhere

RESULTS = REPO / "bench" / "results"
DTYPES = ("float32", "bfloat16")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", type=Path, default=REPO / "models")
    p.add_argument("--prompts", type=int, default=32, help="per domain")
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    p.add_argument("--out", type=Path, default=RESULTS / "accept_dtype.json")
    args = p.parse_args(argv)

    from transformers import AutoTokenizer

    from drafter_service.calibration.rounds import run_rounds
    from drafter_service.demo import corpus
    from dspark import LLM, SamplingParams

    target, drafter = args.models / "target", args.models / "drafters" / "dspark"
    tokenizer = AutoTokenizer.from_pretrained(target)
    prompts = {
        d: corpus.heldout_prompts(d, 2 * args.prompts, args.prompt_tokens, tokenizer)[1::2]
        for d in corpus.DOMAINS
    }
    engines = {
        dtype: LLM(
            str(target),
            drafter="dspark",
            drafter_model=str(drafter),
            drafter_options={"compute_dtype": dtype},
            num_speculative_tokens=7,
            scheduler="fixed",
            max_num_seqs=16,
            kv_cache_memory_mb=256,
        )
        for dtype in DTYPES
    }
    rows = []
    for domain, domain_prompts in prompts.items():
        for temperature in (0.0, 1.0):
            for seed in args.seeds if temperature > 0 else args.seeds[:1]:
                params = SamplingParams(
                    temperature=temperature, max_tokens=args.new_tokens, ignore_eos=True, seed=seed
                )
                for dtype, llm in engines.items():  # alternating, same prompts and seed
                    log = run_rounds(str(target), "dspark", domain_prompts, params, 7, llm=llm)
                    acc = log.acceptance()
                    row = {"domain": domain, "temperature": temperature, "seed": seed, "compute_dtype": dtype}
                    row.update({"tau": acc["tau"], "accept_by_position": acc["accept_by_position"]})
                    rows.append(row)
                    print(
                        f"{domain:5s} T={temperature:g} seed {seed} {dtype:8s}: tau {acc['tau']:.3f}",
                        flush=True,
                    )
    result = {"command": "python bench/accept_dtype.py " + " ".join(argv or sys.argv[1:]), "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
