"""Where a DSpark round's time goes, at concurrency 1 and 8, beside a plain decoding step.

Two engines on one target: plain decoding, and DSpark with a fixed verify length (every drafted token
verified, so drafting never switches off). For each concurrency c, c held-out code prompts are
prefilled, then `--steps` rounds in which all c requests decode are timed with wall-clock timers
wrapped around the engine's and the drafter's methods (a wrapper costs about a microsecond). Plain
and DSpark alternate within every repeat; each figure is the median over repeats of the per-step mean.

With `--code DIR ...` each repeat runs once per code tree, alternating, in a fresh interpreter that
imports that tree (`before`/`after` comparisons in one run, on one machine, under the same load), and
`--speed` adds single-stream decode speed of plain and DSpark (greedy and T=1, same prompts).

    python bench/drafter_profile.py --model /tmp/dsspeed/target --code /tmp/ds_before . --speed
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
# The profile's clock: CPU seconds of this process (one torch thread) measure the work a round does
# whatever else a shared machine runs; wall seconds are what a user waits on an idle one.
CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}

# label -> (where the timer sits, its parent row). Rows nest: a parent's time includes its children's.
# Attribute paths start at the engine; "a|b" times the first that exists; a path the code under test
# lacks is skipped.
COMPONENTS: list[tuple[str, str, str | None]] = [
    ("step", "step", None),
    ("draft", "_propose", "step"),
    ("context folding", "drafter._flush", "draft"),
    ("block forward", "drafter.model.run_block_into|drafter.model.run_block", "draft"),
    ("LM head", "drafter.heads.base_logits|drafter.model.base_logits", "draft"),
    ("Markov walk + sampling", "drafter._walk", "draft"),
    ("proposal checks", "draft_guard._problems", "draft"),
    ("verify-length policy", "policy.choose", "step"),
    ("forward items", "_batch", "step"),
    ("target forward", "runner.forward", "step"),
    ("attention metadata", "module:dspark.runner:AttentionBatch.build", "target forward"),
    ("layers", "model.forward", "target forward"),
    ("logits", "model.logits", "target forward"),
    ("accept (all requests)", "_accept", "step"),
    ("rejection sampling", "module:dspark.engine:verify", "accept (all requests)"),
    ("drafter add_context", "draft_guard.add_context", "accept (all requests)"),
    ("emit (detokenize, stops)", "_emit", "accept (all requests)"),
]


class Timers:
    """Time sums per label while `active` is set; wrappers are installed once per engine."""

    def __init__(self, clock) -> None:
        self.clock = clock
        self.active: dict[str, float] | None = None

    def wrap(self, label: str, fn):
        def timed(*args, **kwargs):
            if self.active is None:
                return fn(*args, **kwargs)
            start = self.clock()
            try:
                return fn(*args, **kwargs)
            finally:
                self.active[label] = self.active.get(label, 0.0) + self.clock() - start

        return timed

    def install(self, engine) -> None:
        for label, paths, _ in COMPONENTS:
            found = next((r for r in map(lambda p: _resolve(engine, p), paths.split("|")) if r), None)
            if found is None:
                continue
            owner, attr = found
            original = getattr(owner, attr)
            if getattr(original, "_profiled", False):
                continue
            wrapped = self.wrap(label, original)
            wrapped._profiled = True
            static = isinstance(owner, type) and isinstance(inspect.getattr_static(owner, attr), staticmethod)
            setattr(owner, attr, staticmethod(wrapped) if static else wrapped)


def _resolve(engine, path: str):
    """(object, attribute name) that a COMPONENTS path names, or None where the code lacks it."""
    if path.startswith("module:"):
        module_path, attr_path = path[len("module:") :].split(":")
        owner, attrs = importlib.import_module(module_path), attr_path.split(".")
    else:
        owner, attrs = engine, path.split(".")
    for attr in attrs[:-1]:
        owner = getattr(owner, attr, None)
    return (owner, attrs[-1]) if owner is not None and hasattr(owner, attrs[-1]) else None


def make_engine(model: str, drafter: str, gamma: int, max_seqs: int):
    from dspark.config import EngineConfig
    from dspark.engine import Engine

    options = {"drafter": "none", "scheduler": "plain"}
    if drafter != "none":
        options = {"drafter": drafter, "scheduler": "fixed", "num_speculative_tokens": gamma}
    return Engine(EngineConfig(model=model, kv_cache_memory_mb=256, max_num_seqs=max_seqs, **options))


def timed_steps(engine, timers: Timers, prompts: list[str], params, steps: int) -> dict[str, float]:
    """Prefill the prompts, then time `steps` steps in which every request decodes: per-step means."""
    from dspark.sequence import Status

    ids = [engine.add_request(p, params) for p in prompts]
    while any(s.status is not Status.DECODE for s in engine.seqs.values()):
        engine.step()
    totals: dict[str, float] = defaultdict(float)
    generated = engine.stats.generated_tokens
    for _ in range(steps):
        timers.active = {}
        engine.step()
        for label, seconds in timers.active.items():
            totals[label] += seconds
    timers.active = None
    totals["tokens"] = engine.stats.generated_tokens - generated
    for request_id in ids:
        engine.abort(request_id)
    return {label: value / steps for label, value in totals.items()}


def worker(args) -> dict:
    """One repeat in this interpreter: plain and DSpark steps at every concurrency and temperature."""
    import torch
    from transformers import AutoTokenizer

    from drafter_service.demo.corpus import heldout_prompts
    from dspark import SamplingParams

    torch.set_num_threads(args.threads)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    prompts = heldout_prompts("code", max(args.concurrency), args.prompt_tokens, tokenizer)
    max_seqs = max(args.concurrency)
    engines = {
        "plain": make_engine(args.model, "none", args.gamma, max_seqs),
        "dspark": make_engine(args.model, "dspark", args.gamma, max_seqs),
    }
    timers = Timers(CLOCKS[args.clock])
    for engine in engines.values():
        timers.install(engine)
    out: dict = {"profile": {}, "speed": {}}
    max_tokens = args.steps * (args.gamma + 1) + 8
    for temperature in args.temperatures:
        params = SamplingParams(temperature=temperature, max_tokens=max_tokens, ignore_eos=True, seed=1)
        for c in args.concurrency:
            for engine in engines.values():  # warm-up: first-call allocations
                timed_steps(engine, timers, prompts[:c], params, 2)
            order = list(engines) if args.rotate % 2 == 0 else list(reversed(engines))
            for name in order:
                key = f"{name} T={temperature:g} c={c}"
                out["profile"][key] = timed_steps(engines[name], timers, prompts[:c], params, args.steps)
    if args.speed:
        out["speed"] = speed(args, engines, tokenizer)
    return out


def speed(args, engines: dict, tokenizer) -> dict:
    """Single-stream decode: seconds and tokens per method and temperature over the same prompts."""
    from drafter_service.demo.corpus import heldout_prompts
    from dspark import SamplingParams

    prompts = heldout_prompts("code", 2 * args.speed_prompts, args.prompt_tokens, tokenizer)[1::2]
    result = {}
    for temperature in args.temperatures:
        for name, engine in engines.items():
            stats = engine.stats
            before = (stats.rounds, stats.drafted_tokens, stats.accepted_tokens)
            seconds = cpu = tokens = 0.0
            for i, prompt in enumerate(prompts):
                params = SamplingParams(
                    temperature=temperature, max_tokens=args.speed_tokens, ignore_eos=True, seed=i
                )
                request_id = engine.add_request(prompt, params)
                engine.step()  # prefill and first token: decode speed excludes it
                start, start_cpu = time.perf_counter(), time.process_time()
                while request_id in engine.seqs:
                    engine.step()
                seconds += time.perf_counter() - start
                cpu += time.process_time() - start_cpu
                tokens += args.speed_tokens - 1
            rounds, drafted, accepted = (
                now - then
                for now, then in zip((stats.rounds, stats.drafted_tokens, stats.accepted_tokens), before)
            )
            result[f"{name} T={temperature:g}"] = {
                "seconds": seconds,
                "cpu_seconds": cpu,
                "tokens": tokens,
                "rounds": rounds,
                "verified_drafts": drafted,
                "accepted_drafts": accepted,
            }
    return result


def run_repeats(args) -> dict[str, list[dict]]:
    """Every repeat in a fresh interpreter per code tree, alternating trees (A B B A A B ...)."""
    runs: dict[str, list[dict]] = {code: [] for code in args.code}
    script = Path(__file__).resolve()
    for rep in range(args.repeats):
        order = args.code if rep % 2 == 0 else list(reversed(args.code))
        for code in order:
            env = dict(os.environ, PYTHONPATH=str(Path(code).resolve()), PYTHONDONTWRITEBYTECODE="1")
            cmd = [sys.executable, str(script), "--worker", "--rotate", str(rep), *args.passthrough]
            done = subprocess.run(cmd, env=env, cwd=code, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise SystemExit(f"worker for {code} failed:\n{done.stderr[-4000:]}")
            runs[code].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"repeat {rep + 1}/{args.repeats}: {code} done", file=sys.stderr, flush=True)
    return runs


def median_profile(repeats: list[dict]) -> dict[str, dict[str, float]]:
    keys = repeats[0]["profile"]
    return {
        key: {
            label: statistics.median(r["profile"][key].get(label, 0.0) for r in repeats)
            for label in repeats[0]["profile"][key]
        }
        for key in keys
    }


def profile_table(profiles: dict[str, dict], concurrency: int, temperature: float, unit: str) -> list[str]:
    """One row per component, a time and a share-of-round column per code tree."""
    key = f"T={temperature:g} c={concurrency}"
    rounds = {code: p[f"dspark {key}"] for code, p in profiles.items()}
    head = " | ".join(f"{code}: {unit} | share" for code in profiles)
    lines = [
        f"| DSpark round, c={concurrency}, T={temperature:g} | {head} |",
        "|---|" + "---:|---:|" * len(profiles),
    ]
    depth = {None: -1}
    for label, _, parent in COMPONENTS:
        depth[label] = depth[parent] + 1
        if not any(label in r for r in rounds.values()):
            continue
        cells = []
        for r in rounds.values():
            if label in r:
                cells.append(f"{1e3 * r[label]:.2f} | {100 * r[label] / r['step']:.0f}%")
            else:
                cells.append("- | -")
        lines.append(f"| {'&nbsp;&nbsp;' * depth[label]}{label} | {' | '.join(cells)} |")
    lines.append("")
    for code, p in profiles.items():
        plain, dspark = p[f"plain {key}"], p[f"dspark {key}"]
        lines.append(
            f"- {code}: plain step {1e3 * plain['step']:.2f} {unit} "
            f"({plain['tokens'] / concurrency:.0f} token per request); "
            f"DSpark round {1e3 * dspark['step']:.2f} {unit} "
            f"({dspark['tokens'] / concurrency:.2f} tokens per request); "
            f"drafting {100 * dspark.get('draft', 0.0) / dspark['step']:.0f}% of the round"
        )
    return [*lines, ""]


def speed_lines(repeats: list[dict], temperatures: list[float]) -> list[str]:
    lines = [
        "| T | plain tok/s (CPU s) | DSpark tok/s (CPU s) | DSpark / plain, CPU s | same, wall s "
        "| verified drafts per round | accepted per round | tau |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for t in temperatures:
        plain = [r["speed"][f"plain T={t:g}"] for r in repeats]
        dspark = [r["speed"][f"dspark T={t:g}"] for r in repeats]
        cells = []
        for clock in ("cpu_seconds", "seconds"):
            ratios = [d["tokens"] / d[clock] / (p["tokens"] / p[clock]) for p, d in zip(plain, dspark)]
            cells.append(f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})")
        p_rate = statistics.median(s["tokens"] / s["cpu_seconds"] for s in plain)
        d_rate = statistics.median(s["tokens"] / s["cpu_seconds"] for s in dspark)
        rounds = sum(s["rounds"] for s in dspark)
        verified = sum(s["verified_drafts"] for s in dspark) / rounds
        accepted = sum(s["accepted_drafts"] for s in dspark) / rounds
        lines.append(
            f"| {t:g} | {p_rate:.1f} | {d_rate:.1f} | {cells[0]} | {cells[1]} | {verified:.2f} "
            f"| {accepted:.2f} | {1 + accepted:.2f} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="models/target")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--gamma", type=int, default=7)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="cpu")
    parser.add_argument("--speed", action="store_true", help="also single-stream decode speed")
    parser.add_argument("--speed-prompts", type=int, default=4)
    parser.add_argument("--speed-tokens", type=int, default=96)
    parser.add_argument("--code", nargs="+", default=["."], help="code trees to compare (first = before)")
    parser.add_argument("--out", default=str(RESULTS / "drafter_profile"), help="writes OUT.json and OUT.md")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--rotate", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return
    args.passthrough = [a for a in sys.argv[1:] if a not in args.code and a not in ("--code",)]
    started = time.strftime("%Y-%m-%d %H:%M")
    runs = run_repeats(args)
    result = {
        "command": "python bench/drafter_profile.py " + " ".join(sys.argv[1:]),
        "started": started,
        "load_average": os.getloadavg(),
        "runs": runs,
    }
    Path(args.out).with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    unit = "CPU ms" if args.clock == "cpu" else "ms"
    profiles = {code: median_profile(repeats) for code, repeats in runs.items()}
    lines = [
        f"`{result['command']}` ({started}, 1-min load average {result['load_average'][0]:.1f}; "
        f"{args.repeats} repeats, trees alternating; medians over repeats of per-round means)",
        "",
    ]
    for t in args.temperatures:
        for c in args.concurrency:
            lines += profile_table(profiles, c, t, unit)
    if args.speed:
        for code, repeats in runs.items():
            lines += [f"Single stream, {code}:", "", *speed_lines(repeats, args.temperatures), ""]
    Path(args.out).with_suffix(".md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
