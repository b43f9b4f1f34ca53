"""The demo target's quality: the share of held-out continuations that fall into a short loop.

Plain decoding (no drafter: the target's own distribution) from held-out prompts of each domain, greedy
and at temperature 1; a continuation loops when its last 32 tokens repeat with a period of at most 8
(a short loop), and, counted apart, when its last 48 repeat with a period of at most 24 (a loop up to a
sentence long; drafter_service/demo/quality.py). Each share comes with its 95% Wilson interval, and the
report shows the first continuations as a user of `make demo` would read them.

    python bench/demo_quality.py --models models
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from transformers import AutoTokenizer

from drafter_service.demo import corpus
from drafter_service.demo.quality import (
    LONG_LOOP_TAIL,
    LONG_MAX_PERIOD,
    LOOP_TAIL,
    MAX_PERIOD,
    loop_period,
    wilson_interval,
)
from dspark import LLM, SamplingParams

RESULTS = Path(__file__).parent / "results"
TEMPERATURES = (0.0, 1.0)
SHOWN = 2  # continuations per domain quoted in the report


def _loops(periods: list[int | None], prefix: str) -> dict:
    """How many continuations loop (a period found), their share and its 95% interval."""
    looping = sum(p is not None for p in periods)
    low, high = wilson_interval(looping, len(periods))
    return {
        f"{prefix}looping": looping,
        f"{prefix}loop_share": round(looping / len(periods), 4),
        f"{prefix}loop_share_95": [round(low, 4), round(high, 4)],
    }


def measure(llm: LLM, prompts: list[str], temperature: float, new_tokens: int) -> dict:
    params = SamplingParams(temperature=temperature, max_tokens=new_tokens, seed=1)
    outputs = llm.generate(prompts, params)
    periods = [loop_period(o.token_ids) for o in outputs]
    return {
        "continuations": len(outputs),
        **_loops(periods, ""),
        "periods": {str(p): periods.count(p) for p in sorted({p for p in periods if p is not None})},
        # Loops up to a sentence long (a short one too, once it fills the tail): what a reader sees.
        **_loops([loop_period(o.token_ids, LONG_LOOP_TAIL, LONG_MAX_PERIOD) for o in outputs], "long_"),
        "stopped_early": sum(o.finish_reason == "stop" for o in outputs),
        "examples": [{"prompt": p[-160:], "continuation": o.text} for p, o in zip(prompts, outputs)][:SHOWN],
    }


def table(result: dict) -> str:
    settings = result["settings"]
    lines = [
        "# Demo target: continuations that fall into a short loop",
        "",
        f"`{result['command']}`: plain decoding of {settings['new_tokens']} tokens from "
        f"{settings['prompts']} held-out prompts per domain of {settings['prompt_tokens']} tokens; "
        f"a continuation loops when its last {LOOP_TAIL} tokens repeat with a period <= {MAX_PERIOD} "
        f"(a short loop), or its last {LONG_LOOP_TAIL} with a period <= {LONG_MAX_PERIOD} (a loop up to "
        "a sentence long: a short one counts there too once it fills those tokens).",
        "",
        "| domain | T | short loops | share (95% interval) | periods | loops up to a sentence | share "
        "(95% interval) | stopped at EOS |",
        "|---|---|---|---|---|---|---|---|",
    ]

    def cells(row: dict, prefix: str) -> str:  # "looping/continuations | share (low-high)"
        low, high = row[f"{prefix}loop_share_95"]
        return (
            f"{row[f'{prefix}looping']}/{row['continuations']} | {row[f'{prefix}loop_share']:.0%} "
            f"({low:.0%}-{high:.0%})"
        )

    for domain, by_t in result["domains"].items():
        for t, row in by_t.items():
            lines.append(
                f"| {domain} | {t} | {cells(row, '')} | {row['periods'] or '-'} | {cells(row, 'long_')} "
                f"| {row['stopped_early']} |"
            )
    lines += ["", "Greedy continuations, as a user would read them:", ""]
    for domain, by_t in result["domains"].items():
        for example in by_t["0.0"]["examples"]:
            lines += [f"- {domain}: `...{example['prompt'][-60:]!r}` -> `{example['continuation']!r}`"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", default="models")
    parser.add_argument("--prompts", type=int, default=64, help="per domain")
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args(argv)
    target = Path(args.models) / "target"
    if not (target / "config.json").exists():
        print(f"no target model at {target}: run `make models` first", file=sys.stderr)
        return 2
    tokenizer = AutoTokenizer.from_pretrained(target)
    llm = LLM(str(target), max_num_seqs=32, kv_cache_memory_mb=256)
    domains = {}
    for domain in corpus.DOMAINS:
        # The odd-indexed held-out windows, as bench/accept.py evaluates on.
        prompts = corpus.heldout_prompts(domain, 2 * args.prompts, args.prompt_tokens, tokenizer)[1::2]
        domains[domain] = {str(t): measure(llm, prompts, t, args.new_tokens) for t in TEMPERATURES}
        print(f"{domain}: " + ", ".join(f"T={t} {r['loop_share']:.0%}" for t, r in domains[domain].items()))
    result = {
        "command": "python bench/demo_quality.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "settings": {
            "prompts": args.prompts,
            "prompt_tokens": args.prompt_tokens,
            "new_tokens": args.new_tokens,
        },
        "domains": domains,
        "summary": {
            **{f"loop_share_{d}_t0": domains[d]["0.0"]["loop_share"] for d in domains},
            **{f"long_loop_share_{d}_t0": domains[d]["0.0"]["long_loop_share"] for d in domains},
        },
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "demo_quality.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "demo_quality.md").write_text(table(result))
    print(f"wrote {out / 'demo_quality.json'} and {out / 'demo_quality.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
