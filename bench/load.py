"""Load sweep: tok/s/user against aggregate tok/s as concurrency grows, for every verify policy.

Methods (one engine each, all built before timing and reused across the sweep; the same engine limits
for all): plain decoding, MTP-1, DSpark with fixed gamma=7, DSpark with the scheduler (Algorithm 1 and the
pipelined variant), DFlash fixed, EAGLE-3 chain; and, at concurrency 1 only, `transformers` assisted
generation with a small draft LM trained here on the same corpus (cached under models/hf_assistant).

The sweep goes concurrency by concurrency, every method in turn at each (the order rotating), so a
machine whose speed drifts during the sweep moves every method of a point alike (bench/load.py sweep).
A point keeps N streams in flight (a finished request is replaced by the next prompt) for max(6N, 24)
requests of held-out prompts from both domains (odd-indexed windows, as bench/accept.py), temperature 1,
seeded per request, ignore_eos with a fixed number of new tokens. tok/s/user is decode speed: per
request (generated tokens - 1) / (finish time - first token time), averaged over requests; aggregate
tok/s is all generated tokens over the point's wall time; mean verify tokens is drafted tokens put to
the target per request-round, from the engine's stats over the point.

    python bench/load.py --models models --reprofile    # full sweep: 9.6 min on a quiet 2-core machine
    python bench/load.py --models models --quick        # N = 1, 4, 16, short requests: load_quick.*
    python bench/load.py --report-from bench/results/load.json   # summary, tables, plots re-derived only

Run it on a quiet machine: with other work on the CPUs, torch's threads contend and steps slow down
tenfold or more (the 1-min load average after every point is in the JSON). --reprofile re-measures the
scheduler's SPS(B) table, so a table cached while the machine was busy cannot skew the scheduled modes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections import Counter, deque
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import transformers
from load_report import HF, SCHEDULED, markdown, plot_budget, plot_frontier, summarize
from tqdm import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.generation.streamers import BaseStreamer

from drafter_service.demo import corpus
from drafter_service.demo.target import TargetShape, TrainConfig, train_target
from dspark import SamplingParams
from dspark.config import EngineConfig
from dspark.engine import Engine

RESULTS = Path(__file__).parent / "results"
GAMMA = 7
# JSON name -> engine options; drafters are found beside the target (models/drafters/NAME).
METHODS: dict[str, dict] = {
    "plain": {"drafter": "none", "scheduler": "plain"},
    # A second, identical plain engine: its distance from plain is the noise band of the run.
    "plain_repeat": {"drafter": "none", "scheduler": "plain"},
    "mtp1": {"drafter": "mtp1", "scheduler": "mtp1"},
    "dspark_fixed": {"drafter": "dspark", "num_speculative_tokens": GAMMA, "scheduler": "fixed"},
    "dspark_scheduled": {"drafter": "dspark", "num_speculative_tokens": GAMMA, "scheduler": "dspark"},
    "dspark_pipelined": {"drafter": "dspark", "num_speculative_tokens": GAMMA, "scheduler": "pipelined"},
    "dflash_fixed": {"drafter": "dflash", "num_speculative_tokens": GAMMA, "scheduler": "fixed"},
    "eagle3": {"drafter": "eagle3", "num_speculative_tokens": GAMMA, "scheduler": "fixed"},
}
# Engine limits shared by every method: max_num_seqs covers the largest concurrency.
ENGINE_LIMITS = {"max_num_seqs": 32, "kv_cache_memory_mb": 128}
# The peer's draft LM: a 2-layer Qwen3 on the target's tokenizer, ~1.4M parameters, about a minute.
ASSISTANT_SHAPE = TargetShape(
    hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
    intermediate_size=384,
)  # fmt: skip
ASSISTANT_TRAIN = TrainConfig(steps=500, lr=3e-3, warmup_steps=20, eval_tokens=8192, max_wall_s=240.0)
MARKER = ".complete"


@dataclass(frozen=True)
class Workload:
    """Request i is prompts[i] with seeds[i], whatever the method or concurrency."""

    prompts: list[list[int]]
    seeds: list[int]
    new_tokens: int
    temperature: float

    def params(self, i: int, new_tokens: int | None = None) -> SamplingParams:
        return SamplingParams(
            temperature=self.temperature,
            max_tokens=new_tokens or self.new_tokens,
            ignore_eos=True,
            seed=self.seeds[i],
        )


# ---- the engine driver ---------------------------------------------------------------------------


def _snapshot(engine: Engine) -> dict:
    st = engine.stats
    return {
        "rounds": st.rounds,
        "drafted": st.drafted_tokens,
        "accepted": st.accepted_tokens,
        "steps": st.steps,
        "draft_s": st.draft_time_s,
        "step_s": st.step_time_s,
        "predicted": st.predicted_accepted_tokens,
        "realised": st.realised_accepted_tokens,
        "lengths": Counter(st.verify_lengths),
    }


def run_point(
    engine: Engine,
    work: Workload,
    concurrency: int,
    num_requests: int,
    bar: tqdm | None = None,
    new_tokens: int | None = None,
) -> dict:
    """Keep `concurrency` requests in flight until requests 0 .. num_requests - 1 have finished."""
    before = _snapshot(engine)
    pending = deque(range(num_requests))
    arrival: dict[str, float] = {}
    first: dict[str, float] = {}
    user_speed, e2e_speed, generated = [], [], 0
    live = 0
    start = time.perf_counter()
    while pending or live:
        while pending and live < concurrency:
            i = pending.popleft()
            rid = f"c{concurrency}-{i}"
            engine.add_request(work.prompts[i], work.params(i, new_tokens), request_id=rid)
            arrival[rid] = time.perf_counter()
            live += 1
        outputs = engine.step()
        now = time.perf_counter()
        for out in outputs:
            rid = out.request_id
            if rid not in first and out.token_ids:
                first[rid] = now
            if out.finished:
                n = len(out.token_ids)
                generated += n
                user_speed.append((n - 1) / (now - first[rid]) if n > 1 and now > first[rid] else 0.0)
                e2e_speed.append(n / (now - arrival[rid]))
                live -= 1
                if bar is not None:
                    bar.update(1)
    wall = time.perf_counter() - start
    after = _snapshot(engine)
    d = {k: after[k] - before[k] for k in after if k != "lengths"}
    lengths = after["lengths"] - before["lengths"]
    rounds = max(d["rounds"], 1)
    return {
        "concurrency": concurrency,
        "tok_s_user": round(statistics.fmean(user_speed), 2),
        "tok_s_total": round(generated / wall, 2),
        "mean_verify_tokens": round(d["drafted"] / rounds, 3),
        "tok_s_user_e2e": round(statistics.fmean(e2e_speed), 2),
        "tau": round((d["accepted"] + d["rounds"]) / rounds, 3),
        "requests": num_requests,
        "generated_tokens": generated,
        "wall_s": round(wall, 3),
        "steps": d["steps"],
        "draft_time_fraction": round(d["draft_s"] / d["step_s"], 3) if d["step_s"] else 0.0,
        "verify_length_hist": [lengths[n] for n in range(max(lengths, default=-1) + 1)],
        "predicted_accepted_tokens": round(d["predicted"], 2),
        "realised_accepted_tokens": d["realised"],
        "loadavg_1m": round(os.getloadavg()[0], 2),  # other work on the machine makes a point noise
    }


# ---- the transformers peer -------------------------------------------------------------------------


class _Clock(BaseStreamer):
    """Times the first generated token (the first `put` is the prompt) and the end of generation."""

    def __init__(self) -> None:
        self.puts, self.first, self.end_time = 0, None, None

    def put(self, value) -> None:
        self.puts += 1
        if self.puts == 2:
            self.first = time.perf_counter()

    def end(self) -> None:
        self.end_time = time.perf_counter()


def ensure_assistant(directory: Path, tokenizer, quick: bool) -> dict:
    """Train the peer's draft LM into `directory` unless its completion marker exists."""
    if (directory / MARKER).exists():
        return json.loads((directory / "training.json").read_text())
    cfg = replace(ASSISTANT_TRAIN, steps=40) if quick else ASSISTANT_TRAIN
    heldout = {d: corpus.documents(d, "heldout") for d in corpus.DOMAINS}
    report = train_target(tokenizer, corpus.train_documents(), heldout, directory, ASSISTANT_SHAPE, cfg)
    (directory / MARKER).write_text(f"trained in {report['wall_seconds']}s\n")
    return report


def run_hf(target: Path, assistant: Path | None, work: Workload, num_requests: int, eos: int) -> dict:
    """`transformers` generate at concurrency 1, with `assistant` as assistant_model when given."""
    transformers.logging.set_verbosity_error()  # per-call deprecation notes about generation_config
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    extra = {}
    if assistant is not None:
        extra["assistant_model"] = AutoModelForCausalLM.from_pretrained(assistant, dtype=torch.float32).eval()
    # Our SamplingParams' defaults (top_k off, top_p 1), not transformers' (top_k 50).
    sampling = {"do_sample": True, "temperature": work.temperature, "top_k": 0, "top_p": 1.0}
    if work.temperature == 0:
        sampling = {"do_sample": False}

    def generate(i: int, n: int) -> _Clock:
        torch.manual_seed(work.seeds[i])
        clock = _Clock()
        ids = work.prompts[i]
        with torch.inference_mode():
            model.generate(
                torch.tensor([ids]),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                max_new_tokens=n,
                min_new_tokens=n,
                pad_token_id=eos,
                streamer=clock,
                **sampling,
                **extra,
            )
        return clock

    for i in range(2):  # warm-up: lazy allocations, first-seen shapes
        generate(i, work.new_tokens // 2)
    n = work.new_tokens
    user_speed, e2e_speed, wall = [], [], 0.0
    for i in range(num_requests):
        start = time.perf_counter()
        clock = generate(i, n)
        wall += clock.end_time - start
        user_speed.append((n - 1) / (clock.end_time - clock.first))
        e2e_speed.append(n / (clock.end_time - start))
    return {
        "concurrency": 1,
        "tok_s_user": round(statistics.fmean(user_speed), 2),
        "tok_s_total": round(n * num_requests / wall, 2),
        "mean_verify_tokens": None,  # transformers does not report its candidate lengths
        "tok_s_user_e2e": round(statistics.fmean(e2e_speed), 2),
        "requests": num_requests,
        "generated_tokens": n * num_requests,
        "wall_s": round(wall, 3),
    }


# ---- main ------------------------------------------------------------------------------------------


def load_prompts(tokenizer, count: int, length: int) -> tuple[list[list[int]], list[list[int]]]:
    """`count` prompts alternating code and prose, and the code ones alone (odd-indexed windows)."""
    by_domain = {
        d: [
            tokenizer.encode(p, add_special_tokens=False)
            for p in corpus.heldout_prompts(d, 2 * count, length, tokenizer)[1::2]
        ]
        for d in corpus.DOMAINS
    }
    mixed = [p for pair in zip(*by_domain.values()) for p in pair]
    if len(mixed) < count:
        raise SystemExit(f"only {len(mixed)} held-out prompts of {length} tokens; need {count}")
    return mixed[:count], by_domain["code"]


def build(target: Path, method: str, work: Workload, reprofile: set[str] | None) -> tuple[Engine, dict]:
    """One method's engine, warmed up, and what the report says of it.

    `reprofile`: None uses cached SPS tables; a set has each table profiled afresh once per run (the
    set remembers which were).
    """
    start = time.perf_counter()
    engine = Engine(EngineConfig(model=str(target), **METHODS[method], **ENGINE_LIMITS))
    table = engine.cost_table  # the scheduled modes load SPS(B) from the cache or profile it here
    if table is not None and reprofile is not None and str(table.path) not in reprofile:
        if table.source == "cache":  # a table profiled on a busy machine misleads the scheduler
            table = engine.load_cost_table(force=True)
        reprofile.add(str(table.path))
    info = {"build_s": round(time.perf_counter() - start, 1)}
    if table is not None:
        info["cost_table"] = {"source": table.source, "path": str(table.path), "points": len(table.points)}
    # Warm-up, not recorded: first-call allocations and the shapes of a small batch.
    run_point(engine, work, 4, 4, new_tokens=work.new_tokens // 2)
    return engine, info


def sweep(
    engines: dict[str, Engine],
    work: Workload,
    code: Workload,
    code_methods: tuple[str, ...],
    concurrency: list[int],
    num,
) -> tuple[list[dict], dict[str, dict]]:
    """Every method's points, concurrency by concurrency: at each, every method in turn, the order
    rotating from one concurrency to the next. A machine whose speed drifts over the minutes of a sweep
    (this one's does) then moves all methods of a point alike, and a ratio at a point compares runs
    minutes apart at most, never a method measured at the start against one at the end. The methods in
    `code_methods` also run a code-only point at concurrency 1."""
    methods = list(engines)
    total = sum(num(c) for c in concurrency) * len(methods) + num(1) * len(code_methods)
    points: dict[str, list[dict]] = {m: [] for m in methods}
    code_points: dict[str, dict] = {}
    with tqdm(total=total, desc="load sweep", unit="req") as bar:
        for k, c in enumerate(concurrency):
            for method in methods[k % len(methods) :] + methods[: k % len(methods)]:
                bar.set_postfix_str(f"{method} N={c}")
                points[method].append({"method": method, **run_point(engines[method], work, c, num(c), bar)})
                if c == 1 and method in code_methods:
                    code_points[method] = {
                        "method": method,
                        **run_point(engines[method], code, 1, num(1), bar),
                    }
    for method in methods:
        for p in points[method]:
            print(
                f"{method:17s} N={p['concurrency']:2d}: {p['tok_s_user']:7.1f} tok/s/user "
                f"{p['tok_s_total']:8.1f} tok/s, verify {p['mean_verify_tokens']:.2f}, tau {p['tau']:.2f}",
                flush=True,
            )
    return [p for m in methods for p in points[m]], code_points


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", default="models")
    parser.add_argument("--concurrency", default="1,2,4,8,16,32")
    parser.add_argument("--methods", default=",".join([*METHODS, HF]))
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=96)
    # Points of 24 requests or more: at 12, two identical plain points at N = 1 parted by up to 20 %.
    parser.add_argument("--requests-factor", type=int, default=6, help="requests per point: factor x N ...")
    parser.add_argument("--min-requests", type=int, default=24, help="... but at least this many")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--anchor-factor", type=float, default=0.8, help="SLA anchor: x plain tok/s/user at N=1"
    )
    parser.add_argument(
        "--reprofile", action="store_true", help="profile SPS(B) afresh instead of using the cached table"
    )
    parser.add_argument(
        "--quick", action="store_true", help="N in 1,4,16, short requests; writes load_quick.*"
    )
    parser.add_argument(
        "--report-from",
        type=Path,
        default=None,
        help="an earlier run's JSON: re-derive its summary, tables and plots from its measured points "
        "(nothing is measured; the result keeps that run's command and records this re-derivation)",
    )
    args = parser.parse_args()
    if args.quick:  # smaller defaults; options given explicitly still win
        parser.set_defaults(concurrency="1,4,16", new_tokens=48, prompt_tokens=32, min_requests=4)
        args = parser.parse_args()
    unknown = set(args.methods.split(",")) - {*METHODS, HF}
    if unknown:
        raise SystemExit(f"unknown methods {sorted(unknown)}")
    return args


def main() -> None:
    args = parse_args()
    if args.report_from is not None:
        report_from(args.report_from, args.anchor_factor)
        return
    name = "load_quick" if args.quick else "load"
    concurrency = [int(c) for c in args.concurrency.split(",")]
    methods = args.methods.split(",")
    models = Path(args.models)
    target = models / "target"
    if any(METHODS.get(m, {}).get("drafter", "none") != "none" for m in methods):
        if not (models / "drafters" / MARKER).exists():
            raise SystemExit(f"{models / 'drafters'} is not built yet (no {MARKER}): make models")

    began = time.perf_counter()
    loadavg_start = [round(x, 2) for x in os.getloadavg()]
    if loadavg_start[0] > 1.0:
        print(f"warning: load average {loadavg_start}: other work on this machine will distort the figures")
    tokenizer = AutoTokenizer.from_pretrained(target)
    num = lambda n: max(args.requests_factor * n, args.min_requests)
    mixed, code = load_prompts(tokenizer, max(num(c) for c in concurrency), args.prompt_tokens)
    seeds = [args.seed * 1_000_003 + i for i in range(len(mixed))]
    work = Workload(mixed, seeds, args.new_tokens, args.temperature)
    code_work = Workload(code[: num(1)], seeds, args.new_tokens, args.temperature)

    # Every engine is built (and its table profiled) before any is timed: the sweep interleaves them.
    built, engines = {}, {}
    reprofiled = set() if args.reprofile else None
    for method in [m for m in methods if m in METHODS]:
        built[method], engines[method] = build(target, method, work, reprofiled)
    code_methods = tuple(m for m in ("plain", SCHEDULED) if m in built)
    points, code_points = sweep(built, work, code_work, code_methods, concurrency, num)

    hf_plain = assistant = None
    if HF in methods:
        assistant_dir = models / "hf_assistant"
        if args.quick and not (assistant_dir / MARKER).exists():
            assistant_dir = models / "hf_assistant_quick"  # never cache a quick one as the real peer
        report = ensure_assistant(assistant_dir, tokenizer, args.quick)
        keys = ("parameters", "steps_done", "loss_last", "heldout_perplexity", "wall_seconds")
        assistant = {"path": str(assistant_dir), **{k: report.get(k) for k in keys}}
        print("transformers generate at N=1: assisted, then without assistant ...", flush=True)
        eos = tokenizer.eos_token_id
        points.append({"method": HF, **run_hf(target, assistant_dir, work, num(1), eos)})
        hf_plain = run_hf(target, None, work, num(1), eos)

    summary = summarize(points, code_points, args.anchor_factor, hf_plain)
    result = {
        "command": "python bench/load.py " + " ".join(sys.argv[1:]),
        "points": points,
        "summary": summary,
        "single_stream_code": code_points,
        "hf_plain": hf_plain,
        "hf_assistant": assistant,
        "engines": engines,
        "workload": {
            "prompt_tokens": args.prompt_tokens,
            "new_tokens": args.new_tokens,
            "temperature": args.temperature,
            "seed": args.seed,
            "concurrency": concurrency,
            "requests_factor": args.requests_factor,
            "min_requests": args.min_requests,
            "max_num_seqs": ENGINE_LIMITS["max_num_seqs"],
            "gamma": GAMMA,
            "domains": list(corpus.DOMAINS),
        },
        "machine": {
            "cpu_threads": torch.get_num_threads(),
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "loadavg_start": loadavg_start,
            "loadavg_end": [round(x, 2) for x in os.getloadavg()],
        },
        "wall_minutes": round((time.perf_counter() - began) / 60, 2),
    }
    write(result, name)


def report_from(path: Path, anchor_factor: float) -> None:
    """The summary, tables and plots of the run at `path` re-derived from its points by this code."""
    result = json.loads(path.read_text())
    result["summary"] = summarize(
        result["points"], result["single_stream_code"], anchor_factor, result.get("hf_plain")
    )
    result["report_derived_by"] = "python bench/load.py " + " ".join(sys.argv[1:])
    write(result, path.stem)


def write(result: dict, name: str) -> None:
    """NAME.json, NAME.md and the two plots in bench/results."""
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    frontier, budget = f"{name}_frontier.png", f"{name}_verify_budget.png"
    text = markdown(result, frontier, budget)
    (RESULTS / f"{name}.md").write_text(text)
    anchor = result["summary"]["sla_anchor_throughput"]["anchor_tok_s_user"]
    plot_frontier(result["points"], anchor, RESULTS / frontier)
    plot_budget(result["points"], RESULTS / budget)
    print(text)


if __name__ == "__main__":
    main()
