"""Build the demo model stack: ``python -m drafter_service.demo.build --out models``.

The build is an ordered list of `Step`s, each writing one directory under ``--out`` and finishing by
writing a completion marker. A step whose marker exists is skipped, so rerunning after an interruption
redoes only what is missing, and a half-written directory (no marker) is wiped and rebuilt. Drafters
(``drafters/dspark``, ``drafters/dflash``, ``drafters/eagle3``, ``drafters/mtp1``) are appended to
`STEPS` as further entries; each may read the directories of the steps before it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from drafter_service.demo import corpus
from drafter_service.demo.target import TargetShape, TrainConfig, train_target
from drafter_service.demo.tokenizer import train_tokenizer

MARKER = ".complete"


@dataclass(frozen=True)
class BuildContext:
    """What every step may use: the output root and the command-line options."""

    out: Path
    target_steps: int | None = None
    max_train_seconds: float | None = None

    @property
    def target_dir(self) -> Path:
        return self.out / "target"


@dataclass(frozen=True)
class Step:
    """One build product: ``run(ctx, directory)`` fills ``ctx.out / subdir``."""

    name: str
    subdir: str
    run: Callable[[BuildContext, Path], None]


def build_target(ctx: BuildContext, directory: Path) -> None:
    """Tokenizer and target trained on the corpus's train split, saved together in ``directory``."""
    start = time.perf_counter()
    train_texts = corpus.train_documents()
    tokenizer = train_tokenizer(train_texts)
    print(
        f"  corpus + tokenizer: {len(train_texts)} documents, {time.perf_counter() - start:.1f}s", flush=True
    )
    heldout = {domain: corpus.documents(domain, "heldout") for domain in corpus.DOMAINS}
    cfg = replace(TrainConfig(), max_wall_s=ctx.max_train_seconds)
    if ctx.target_steps is not None:
        cfg = replace(cfg, steps=ctx.target_steps, warmup_steps=min(cfg.warmup_steps, ctx.target_steps))
    report = train_target(tokenizer, train_texts, heldout, directory, TargetShape(), cfg)
    ppl = ", ".join(f"{d} {p:.2f}" for d, p in report["heldout_perplexity"].items() if p is not None)
    print(
        f"  target: {report['parameters'] / 1e6:.2f}M params, {report['tokens_trained']:,} tokens, "
        f"loss {report['loss_first']:.2f} -> {report['loss_last']:.2f}, held-out ppl {ppl}",
        flush=True,
    )


def build_all_drafters(ctx: BuildContext, directory: Path) -> None:
    """DSpark, DFlash, EAGLE-3, MTP-1 and the Markov ablation, trained together on the target's states."""
    from drafter_service.demo.drafters import build_drafters

    build_drafters(ctx.target_dir, directory)


# Order matters: later steps (drafters) read models/target.
STEPS: list[Step] = [
    Step("target", "target", build_target),
    Step("drafters", "drafters", build_all_drafters),
]


def run_steps(ctx: BuildContext, steps: Sequence[Step] = STEPS) -> dict[str, float]:
    """Run the steps whose marker is missing; returns the seconds each step took (0 when skipped)."""
    timings: dict[str, float] = {}
    for i, step in enumerate(steps, 1):
        directory = ctx.out / step.subdir
        if (directory / MARKER).exists():
            print(f"[{i}/{len(steps)}] {step.name}: up to date ({directory})", flush=True)
            timings[step.name] = 0.0
            continue
        if directory.exists():  # Left by an interrupted build: stale files must not mix with new ones.
            shutil.rmtree(directory)
        directory.mkdir(parents=True)
        print(f"[{i}/{len(steps)}] {step.name}: building {directory}", flush=True)
        start = time.perf_counter()
        step.run(ctx, directory)
        timings[step.name] = time.perf_counter() - start
        (directory / MARKER).write_text(f"built in {timings[step.name]:.1f}s\n")
        print(f"[{i}/{len(steps)}] {step.name}: done in {timings[step.name]:.1f}s", flush=True)
    return timings


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("models"), help="output root (default: models)")
    parser.add_argument("--target-steps", type=int, default=None, help="override the target's step count")
    parser.add_argument(
        "--max-train-seconds",
        type=float,
        default=None,
        help="stop target training by the clock (safety net; makes weights machine-dependent)",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(os.cpu_count() or 1)  # The build owns the machine.
    start = time.perf_counter()
    ctx = BuildContext(args.out, args.target_steps, args.max_train_seconds)
    run_steps(ctx)
    print(f"models ready in {args.out} ({time.perf_counter() - start:.1f}s)", flush=True)


if __name__ == "__main__":
    main()
