"""The demo target's recipe: train candidate shapes for the same build time, compare held-out quality.

`make models` has about 15 minutes on an idle two-core machine, the target about 6 of them. In that
budget a model sees a million or two tokens, far fewer than its parameters want, so a smaller model that
sees more tokens may end lower than a larger one that sees fewer. Each candidate here is the demo
target's own training (drafter_service/demo/target.py train_target) at a step count that fills the same
time at its measured speed; the report gives each one's held-out perplexity per domain, the shares of its
greedy held-out continuations that fall into a short loop and into a loop up to a sentence long
(bench/demo_quality.py's measure, fewer prompts), its tokens and its wall time, with the loss curves
plotted.

    python bench/target_sweep.py [--only NAME ...] [--out bench/results]

Run on an otherwise idle machine: a candidate's steps are fixed (so its weights reproduce), its wall
time is what the machine gave it. Results are merged by candidate into target_sweep.json, so candidates
can be run one at a time.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from drafter_service.demo import corpus
from drafter_service.demo.target import TargetShape, TrainConfig, train_target
from drafter_service.demo.tokenizer import train_tokenizer
from dspark import LLM

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere
from bench.demo_quality import measure  # noqa: E402

RESULTS = Path(__file__).parent / "results"


@dataclass(frozen=True)
class Candidate:
    name: str
    shape: TargetShape
    steps: int  # fills ~6 minutes at the shape's measured step time (2 threads, bf16, 4 x 512 tokens)
    lr: float


def _shape(hidden: int, layers: int, heads: int, kv_heads: int, intermediate: int) -> TargetShape:
    return TargetShape(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=intermediate,
    )


CANDIDATES = (
    Candidate("h384_l5", _shape(384, 5, 6, 2, 1024), 520, 2e-3),  # the recipe before this sweep
    Candidate("h256_l6", _shape(256, 6, 4, 2, 704), 650, 3e-3),
    Candidate("h256_l4", _shape(256, 4, 4, 2, 704), 850, 3e-3),
    Candidate("h192_l4", _shape(192, 4, 3, 1, 512), 1090, 4e-3),
)


def run_candidate(c: Candidate, tokenizer, train_texts, heldout, prompts, new_tokens: int) -> dict:
    cfg = replace(TrainConfig(), steps=c.steps, lr=c.lr)
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        report = train_target(tokenizer, train_texts, heldout, Path(tmp), c.shape, cfg)
        wall = time.perf_counter() - start
        llm = LLM(tmp, max_num_seqs=32, kv_cache_memory_mb=256)
        loops = {d: measure(llm, p, 0.0, new_tokens) for d, p in prompts.items()}
    return {
        "shape": asdict(c.shape),
        "steps": c.steps,
        "lr": c.lr,
        "parameters": report["parameters"],
        "tokens_trained": report["tokens_trained"],
        "train_wall_s": round(wall, 1),
        "heldout_perplexity": {d: round(p, 2) for d, p in report["heldout_perplexity"].items()},
        "greedy_loop_share": {d: r["loop_share"] for d, r in loops.items()},
        "greedy_long_loop_share": {d: r["long_loop_share"] for d, r in loops.items()},
        "losses": report["losses"],
    }


def table(results: dict) -> str:
    lines = [
        "# Demo target recipe: candidates trained for the same build time",
        "",
        "`python bench/target_sweep.py`: each candidate is `train_target` (batch 4 x 512 tokens, bf16, "
        "2 threads) at a step count that fills about 6 minutes at its speed; held-out perplexity on the "
        "corpus's held-out split, greedy loop share on held-out prompts (bench/demo_quality.py's measure).",
        "",
        "| candidate | parameters | steps | tokens | wall s | ppl code | ppl prose "
        "| short loops code / prose | loops up to a sentence code / prose |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in results["candidates"].items():
        ppl, short, long = r["heldout_perplexity"], r["greedy_loop_share"], r["greedy_long_loop_share"]
        lines.append(
            f"| {name} | {r['parameters'] / 1e6:.1f}M | {r['steps']} | {r['tokens_trained'] / 1e6:.2f}M "
            f"| {r['train_wall_s']:.0f} | {ppl['code']:.1f} | {ppl['prose']:.1f} "
            f"| {short['code']:.0%} / {short['prose']:.0%} | {long['code']:.0%} / {long['prose']:.0%} |"
        )
    lines += ["", "![training loss by tokens trained](target_sweep.png)"]
    return "\n".join(lines) + "\n"


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    window = 25  # steps: one batch's loss is too noisy to tell the curves apart
    for name, r in results["candidates"].items():
        losses, n = r["losses"], len(r["losses"])
        smooth = [sum(losses[max(0, i + 1 - window) : i + 1]) / min(window, i + 1) for i in range(n)]
        per_step = r["tokens_trained"] / r["steps"]
        tokens = [(i + 1) * per_step / 1e6 for i in range(n)]
        ax.plot(tokens, smooth, label=f"{name} ({r['parameters'] / 1e6:.1f}M)", linewidth=1.2)
    ax.set_xlabel("tokens trained (M)")
    ax.set_ylabel(f"training loss (mean of the last {window} steps)")
    ax.set_ylim(4.0, 9.5)
    ax.set_title("Demo target candidates, same build time")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", nargs="*", default=None, help="candidate names (default: all)")
    parser.add_argument("--prompts", type=int, default=32, help="held-out prompts per domain for loops")
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args(argv)
    torch.set_num_threads(os.cpu_count() or 1)  # as `make models` runs
    chosen = [c for c in CANDIDATES if args.only is None or c.name in args.only]
    train_texts = corpus.train_documents()
    tokenizer = train_tokenizer(train_texts)
    heldout = {d: corpus.documents(d, "heldout") for d in corpus.DOMAINS}
    prompts = {d: corpus.heldout_prompts(d, 2 * args.prompts, 64, tokenizer)[1::2] for d in corpus.DOMAINS}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "target_sweep.json"
    results = json.loads(path.read_text()) if path.exists() else {"candidates": {}}
    for i, c in enumerate(chosen, 1):
        print(f"[{i}/{len(chosen)}] {c.name}: {c.steps} steps", flush=True)
        r = run_candidate(c, tokenizer, train_texts, heldout, prompts, args.new_tokens)
        results["candidates"][c.name] = r
        results["command"] = "python bench/target_sweep.py"
        path.write_text(json.dumps(results, indent=1) + "\n")
        print(f"  ppl {r['heldout_perplexity']}, loops {r['greedy_loop_share']}, {r['train_wall_s']}s")
    (out / "target_sweep.md").write_text(table(results))
    plot(results, out / "target_sweep.png")
    print(f"wrote {path}, target_sweep.md, target_sweep.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
