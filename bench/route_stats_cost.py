"""What publishing routing stats every 0.25 s costs a replica (Serve's default period is 10 s).

A TargetReplica in this process (no Ray; the same class Serve runs) decodes a batch of requests while
a task calls its `record_routing_stats()` every --period seconds, as Serve's controller does. Recorded:
  - each call's time on the replica's event loop (mostly waiting for the engine step in flight), and
    the engine-thread part alone (replica_state.snapshot, run between two steps: the engine waits
    for it), idle and under load;
  - the batch's decode throughput with the stats period at 0.25 s and at 10 s, alternating runs.
The engine's cost is its snapshot time times the calls per second (at 0.25 s, 4 a second); the A/B
throughput says whether anything else (the Ray call, the event loop) shows.

    python bench/route_stats_cost.py --model models/target [--drafter dspark] [--runs 3]

Writes bench/results/route_stats_cost.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
RESULTS = REPO / "bench" / "results"


async def decode(
    replica, prompt: list[int], batch: int, max_tokens: int, period_s: float, seconds: float
) -> dict:
    """`batch` requests always in flight for `seconds`, stats read every `period_s`."""
    from dspark.sampling_params import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    calls: list[float] = []
    deadline = time.perf_counter() + seconds

    async def one() -> int:
        tokens = 0
        while time.perf_counter() < deadline:
            async for event in replica.generate(prompt, params, uuid.uuid4().hex):
                tokens += len(event.token_ids)
        return tokens

    async def stats_loop() -> None:
        while True:
            start = time.perf_counter()
            await replica.record_routing_stats()
            calls.append(time.perf_counter() - start)
            await asyncio.sleep(period_s)

    poller = asyncio.get_running_loop().create_task(stats_loop())
    start = time.perf_counter()
    tokens = sum(await asyncio.gather(*(one() for _ in range(batch))))
    elapsed = time.perf_counter() - start
    poller.cancel()
    return {"tok_s": tokens / elapsed, "calls": len(calls), "call_ms": [c * 1e3 for c in calls]}


def timed_snapshots(into: list[float]):
    """replica_state.snapshot, recording its time on the engine thread (what the engine waits for)."""
    from deployments import replica_state

    plain = replica_state.snapshot

    def snapshot(engine, table=None):
        start = time.perf_counter()
        try:
            return plain(engine, table)
        finally:
            into.append(time.perf_counter() - start)

    replica_state.snapshot = snapshot


def snapshot_ms(replica, repeats: int = 200) -> float:
    """The engine-thread part of one call (replica_state.snapshot), median over `repeats`, idle engine."""
    from deployments import replica_state

    engine = replica.engine.engine
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        replica_state.snapshot(engine, replica._routing_table)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=REPO / "models" / "target")
    parser.add_argument("--drafter", default="dspark")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8.0, help="per run")
    parser.add_argument("--periods", type=float, nargs="+", default=[0.25, 10.0])
    parser.add_argument("--out", type=Path, default=RESULTS / "route_stats_cost.json")
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(1)
    from deployments.replica import TargetReplica

    engine = {"drafter": args.drafter, "max_num_seqs": args.batch, "cost_table_profile": "coarse"}
    replica = TargetReplica.func_or_class({"model": str(args.model.resolve()), "engine": engine})
    prompt = replica.engine.engine.tokenize("def parse(text):\n    " * 4)
    engine_thread: list[float] = []
    try:
        idle_snapshot_ms = snapshot_ms(replica)
        asyncio.run(decode(replica, prompt, args.batch, 16, 10.0, 1.0))  # warm up
        timed_snapshots(engine_thread)
        runs: dict[str, list[dict]] = {str(p): [] for p in args.periods}
        for r in range(args.runs):
            for period in args.periods if r % 2 == 0 else reversed(args.periods):
                runs[str(period)].append(
                    asyncio.run(decode(replica, prompt, args.batch, args.max_tokens, period, args.seconds))
                )
    finally:
        replica.__del__()
    by_period = {}
    for period, results in runs.items():
        calls = [c for run in results for c in run["call_ms"]]
        by_period[period] = {
            "tok_s_runs": [round(run["tok_s"], 1) for run in results],
            "tok_s_median": round(statistics.median(run["tok_s"] for run in results), 1),
            "calls": len(calls),
            "call_ms_median": round(statistics.median(calls), 3) if calls else None,
            "call_ms_max": round(max(calls), 3) if calls else None,
        }
    fast, slow = by_period[str(min(args.periods))], by_period[str(max(args.periods))]
    call_ms = fast["call_ms_median"] or 0.0
    result = {
        "command": "python bench/route_stats_cost.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": {"platform": platform.platform(), "load_avg_1m_at_end": round(os.getloadavg()[0], 2)},
        "config": {
            "model": str(args.model),
            **engine,
            "batch": args.batch,
            "max_tokens": args.max_tokens,
            "runs": args.runs,
        },
        "snapshot_ms_engine_thread_idle": round(idle_snapshot_ms, 4),
        # Under load: the part of a call the engine itself waits for (the rest of a call's time on the
        # event loop is mostly waiting for the step in flight to end, which costs the engine nothing).
        "snapshot_ms_engine_thread_under_load": {
            "median": round(statistics.median(engine_thread) * 1e3, 4),
            "max": round(max(engine_thread) * 1e3, 4),
            "count": len(engine_thread),
        },
        "by_period_s": by_period,
        "summary": {
            "call_ms_median_under_load": call_ms,
            # The engine thread's share of each second spent on snapshots at the fastest period.
            "engine_fraction_at_fastest_period": round(
                statistics.median(engine_thread) / min(args.periods), 6
            ),
            "throughput_ratio_fast_vs_slow_period": round(fast["tok_s_median"] / slow["tok_s_median"], 4),
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["summary"], indent=2), f"\nengine-thread snapshot: {idle_snapshot_ms:.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
