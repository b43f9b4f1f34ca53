"""What telemetry costs: engine tok/s with tracing off, on at the default step-sampling rate, and on at
100%, side by side in one run.

    python bench/telemetry.py --model models/target            # the demo models (`make models`)
    python bench/telemetry.py --model models/target --quick    # a smoke run: tiny settings

Arms, all on one engine (same weights, same cost table), the same prompts, greedy:

  off        no telemetry: the engine has no step observer, no span, no instrument
  off_again  the same again: an A/A control; its gap to `off` is the noise band of this machine
  default    a target replica's telemetry as `OTEL_EXPORTER_OTLP_ENDPOINT=... make serve` sets it
             up: every request a span (the SDK's default sampler), metrics, engine steps as span
             events on DSPARK_TRACE_STEP_SAMPLE_RATE's default share of steps; exported over
             OTLP/gRPC to a receiver in another process (its decoding is not charged to the engine)
  full       the same with every engine step an event (rate 1.0)

Each repeat runs every arm once on a batch of concurrent requests, in an order rotated by one arm per
repeat, so drift on a noisy machine hits every arm alike. Costs are paired: each arm's tok/s over
`off`'s in the same repeat, the median over repeats. The target is <= 1% at the default rate; a cost
inside the noise band (the largest |off_again / off - 1|) is not told apart from none. Every arm's
greedy output must equal `off`'s: telemetry never changes what is generated.

Writes bench/results/telemetry.json and telemetry.md. Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import socket
import statistics
import sys
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).parent / "results"
ARMS = ("off", "off_again", "default", "full")
FULL_RATE = 1.0
TARGET_COST = 0.01


# ---- the OTLP receiver, in a process of its own -----------------------------------------------------------


def _receive(port: int, ready, stop, counts) -> None:
    """Child process: an OTLP/gRPC receiver; on `stop`, puts spans and step events by service name."""
    from dspark.telemetry.receiver import OTLPReceiver

    receiver = OTLPReceiver("127.0.0.1", port)
    ready.set()
    stop.wait()
    found: dict[str, dict[str, int]] = {}
    for span in receiver.spans():
        mine = found.setdefault(span.resource.get("service.name", "?"), {"spans": 0, "step_events": 0})
        mine["spans"] += 1
        mine["step_events"] += sum(name == "dspark.step" for name, _, _ in span.events)
    receiver.close()
    counts.put(found)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- one arm ----------------------------------------------------------------------------------------------


class Arm:
    """An arm's telemetry (None: off), attached to the shared engine only while the arm runs."""

    def __init__(self, name: str, engine, endpoint: str, rate: float | None) -> None:
        from dspark.telemetry.engine_telemetry import EngineTelemetry
        from dspark.telemetry.setup import setup_telemetry

        self.name, self.engine, self.traced = name, engine, None
        if rate is None:
            return
        os.environ.update(
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
                "OTEL_SERVICE_NAME": f"bench-{name}",
                "DSPARK_TRACE_STEP_SAMPLE_RATE": str(rate),
            }
        )
        try:
            self.telemetry = setup_telemetry("replica", {"dspark.replica.id": name}, set_global=False)
        finally:
            for var in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_SERVICE_NAME", "DSPARK_TRACE_STEP_SAMPLE_RATE"):
                os.environ.pop(var, None)
        assert self.telemetry.tracing and self.telemetry.metering
        self.traced = EngineTelemetry(self.telemetry, engine, "target", name)
        engine.step_observers.remove(self.traced.on_step)  # attached in run() only

    def run(self, prompts: list[list[int]], params) -> tuple[float, list[list[int]]]:
        """All prompts as concurrent requests; (seconds, output tokens of each)."""
        from dspark.telemetry import semconv as sc

        engine = self.engine
        if self.traced is not None:
            engine.step_observers.append(self.traced.on_step)
        try:
            start = time.perf_counter()
            traces, outputs = {}, {}
            for i, prompt in enumerate(prompts):
                rid = engine.add_request(prompt, params)
                if self.traced is not None:
                    traces[rid] = self.traced.start(rid, f"r{i}", sc.TEXT_COMPLETION, params)
                outputs[rid] = None
            while engine.has_unfinished():
                for out in engine.step():
                    if out.finished:
                        outputs[out.request_id] = out.token_ids
                        if self.traced is not None:
                            traces[out.request_id].finished(out)
            seconds = time.perf_counter() - start
        finally:
            if self.traced is not None:
                engine.step_observers.remove(self.traced.on_step)
        return seconds, list(outputs.values())

    def flush(self) -> None:
        if self.traced is not None:
            self.telemetry.flush(timeout_ms=30_000)

    def shutdown(self) -> None:
        if self.traced is not None:
            self.telemetry.shutdown()


# ---- the run ----------------------------------------------------------------------------------------------


def paired_ratios(seconds: dict[str, list[float]]) -> dict[str, list[float]]:
    """Each arm's tok/s over `off`'s, repeat by repeat (same tokens: the time ratio inverted)."""
    return {arm: [off / s for off, s in zip(seconds["off"], times)] for arm, times in seconds.items()}


def summarize(seconds: dict[str, list[float]], tokens_per_run: int) -> dict:
    ratios = paired_ratios(seconds)
    noise = max(abs(r - 1) for r in ratios["off_again"])
    arms = {}
    for arm, times in seconds.items():
        tok_s = [tokens_per_run / s for s in times]
        cost = 1 - statistics.median(ratios[arm])
        arms[arm] = {
            "tok_s_median": round(statistics.median(tok_s), 2),
            "tok_s_min": round(min(tok_s), 2),
            "tok_s_max": round(max(tok_s), 2),
            "tok_s_each": [round(t, 2) for t in tok_s],
            "ratio_to_off_each": [round(r, 4) for r in ratios[arm]],
            "cost_median": round(cost, 4),
        }
    return {"arms": arms, "noise_band": round(noise, 4)}


def verdict(cost: float, noise: float) -> str:
    if cost <= TARGET_COST:
        return f"met (<= {TARGET_COST:.0%})"
    if cost <= noise:
        return f"not resolved: inside the noise band ({noise:.1%})"
    return f"missed (> {TARGET_COST:.0%})"


def table(result: dict) -> str:
    s, w = result["summary"], result["workload"]
    lines = [
        "# Telemetry overhead",
        "",
        f"`{result['command']}`: {result['model']['parameters'] / 1e6:.1f}M-parameter target, drafter "
        f"{w['drafter']} (scheduler {w['scheduler']}), {w['batch']} concurrent requests of "
        f"{w['prompt_tokens']} prompt tokens and {w['new_tokens']} new tokens, greedy, "
        f"{w['repeats']} repeats (arms interleaved), {result['machine']['torch_threads']} torch thread(s).",
        "",
        "| arm | step events | tok/s (median) | min..max | cost vs off (median, paired) |",
        "|---|---|---:|---:|---:|",
    ]
    for arm in ARMS:
        a = s["arms"][arm]
        rate = result["step_sample_rates"].get(arm)
        events = "—" if rate is None else f"{rate:.0%} of steps"
        lines.append(
            f"| {arm} | {events} | {a['tok_s_median']:.1f} | {a['tok_s_min']:.1f}..{a['tok_s_max']:.1f} | "
            f"{100 * a['cost_median']:+.2f}% |"
        )
    received = result["received"]
    lines += [
        "",
        f"Noise band (largest |off_again / off - 1| over repeats): {100 * s['noise_band']:.2f}%.",
        f"Target <= {TARGET_COST:.0%} at the default rate: {result['verdict_default']}.",
        "Exported and received over OTLP/gRPC: "
        + ", ".join(
            f"{arm} {received.get(f'bench-{arm}', {}).get('spans', 0)} spans / "
            f"{received.get(f'bench-{arm}', {}).get('step_events', 0)} step events"
            for arm in ("default", "full")
        )
        + ".",
        f"Greedy output of every arm equal to off's: {result['outputs_identical']}.",
    ]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="models/target", help="the target checkpoint (`make models`)")
    parser.add_argument(
        "--drafter", default="dspark", help="dspark (falls back to ngram if not built), ngram, ..."
    )
    parser.add_argument("--gamma", type=int, default=7)
    parser.add_argument("--scheduler", default="dspark")
    parser.add_argument("--batch", type=int, default=8, help="concurrent requests per run")
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: 2 requests, 16 tokens, 2 repeats (flags given win)"
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    if parser.parse_known_args(argv)[0].quick:
        parser.set_defaults(batch=2, prompt_tokens=24, new_tokens=16, repeats=2)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    model = Path(args.model)
    if not (model / "config.json").is_file():
        print(
            f"[telemetry] no target checkpoint at {model}/ (config.json missing): build the demo models with "
            "`make models`, or pass --model DIR",
            file=sys.stderr,
        )
        return 2
    drafter = args.drafter
    if (
        drafter not in ("none", "ngram")
        and not (model.parent / "drafters" / drafter / "config.json").is_file()
    ):
        print(f"[telemetry] drafter {drafter!r} not built beside {model}: using 'ngram'", flush=True)
        drafter = "ngram"
    torch.set_num_threads(args.threads)
    from transformers import AutoTokenizer

    from drafter_service.demo.corpus import heldout_prompts
    from dspark.config import EngineConfig
    from dspark.engine import Engine
    from dspark.sampling_params import SamplingParams
    from dspark.telemetry.settings import DEFAULT_STEP_SAMPLE_RATE

    tokenizer = AutoTokenizer.from_pretrained(model)
    texts = heldout_prompts("code", args.batch, args.prompt_tokens, tokenizer)
    prompts = [tokenizer.encode(t, add_special_tokens=False) for t in texts]
    if len(prompts) < args.batch:
        raise SystemExit(f"[telemetry] only {len(prompts)} held-out prompts of {args.prompt_tokens} tokens")
    params = SamplingParams(temperature=0, max_tokens=args.new_tokens, ignore_eos=True)
    engine = Engine(
        EngineConfig(
            model=str(model),
            drafter=drafter,
            num_speculative_tokens=args.gamma,
            scheduler=args.scheduler,
            cost_table_profile="coarse",
            max_num_seqs=max(16, args.batch),
            kv_cache_memory_mb=256,
        )
    )

    rates = {"off": None, "off_again": None, "default": DEFAULT_STEP_SAMPLE_RATE, "full": FULL_RATE}
    spawn = mp.get_context("spawn")  # no fork of a process holding torch threads and gRPC
    port, ready, stop, counts = free_port(), spawn.Event(), spawn.Event(), spawn.Queue()
    child = spawn.Process(target=_receive, args=(port, ready, stop, counts), daemon=True)
    child.start()
    if not ready.wait(timeout=120):
        raise SystemExit("[telemetry] the OTLP receiver process did not start")
    arms = {name: Arm(name, engine, f"http://127.0.0.1:{port}", rate) for name, rate in rates.items()}
    try:
        for arm in arms.values():  # warm-up, not recorded: first-call allocations, lazy imports
            arm.run(prompts[:2], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
        seconds: dict[str, list[float]] = {name: [] for name in ARMS}
        reference: list[list[int]] | None = None
        identical = True
        order = list(ARMS)
        for rep in range(args.repeats):
            for name in order[rep % len(order) :] + order[: rep % len(order)]:
                took, outputs = arms[name].run(prompts, params)
                seconds[name].append(took)
                reference = reference if reference is not None else outputs
                identical &= outputs == reference
            print(
                f"[telemetry] repeat {rep + 1}/{args.repeats}: "
                + ", ".join(f"{n} {args.batch * args.new_tokens / seconds[n][-1]:.1f} tok/s" for n in ARMS),
                flush=True,
            )
        for arm in arms.values():
            arm.flush()
    finally:
        for arm in arms.values():
            arm.shutdown()
        stop.set()
    received = counts.get(timeout=120)
    child.join(timeout=60)

    summary = summarize(seconds, args.batch * args.new_tokens)
    result = {
        "command": "python bench/telemetry.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": {
            "torch_threads": torch.get_num_threads(),
            "platform": platform.platform(),
            "torch": torch.__version__,
        },
        "model": {"path": str(model), "parameters": sum(p.numel() for p in engine.model.parameters())},
        "workload": {
            "drafter": drafter,
            "gamma": args.gamma,
            "scheduler": args.scheduler,
            "batch": args.batch,
            "prompt_tokens": args.prompt_tokens,
            "new_tokens": args.new_tokens,
            "repeats": args.repeats,
            "quick": args.quick,
        },
        "step_sample_rates": {k: v for k, v in rates.items() if v is not None},
        "summary": summary,
        "verdict_default": verdict(summary["arms"]["default"]["cost_median"], summary["noise_band"]),
        "verdict_full": verdict(summary["arms"]["full"]["cost_median"], summary["noise_band"]),
        "received": received,
        "outputs_identical": identical,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "telemetry.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / "telemetry.md").write_text(table(result))
    print(table(result), flush=True)
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
