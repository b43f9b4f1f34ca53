"""Thread placement A/B on one running stack: serving_thread_policy and engine_cpu, interleaved with offline.

bench/serve.py compares arms across separate runs minutes apart, which a machine shared with other work
(or an idle one that drifts) swamps at concurrency 1. This starts one bench stack (one target replica,
one ingress replica, direct ingress, bench/serve.py's `start_stack`) and the offline engine beside it,
then for `--rounds` rounds runs every arm back to back, in rotating order, on the same prompts:
offline, and the served stack over HTTP and gRPC under each placement, set from here on the serving
processes' threads as deployments/thread_policy.py sets them from inside (a process may change the
policy and affinity of its user's threads; the engine thread is the replica's `dspark-engine`):
  normal   serving_thread_policy: normal (every thread SCHED_OTHER on every CPU)
  batch    serving_thread_policy: batch, the default (every thread but the engine's SCHED_BATCH)
  pinned   batch, and engine_cpu: the last CPU (the engine thread alone there, the rest on the others)
Per arm it reports tok/s/user against offline in the same round (median over rounds), and the engine
thread's CPU, run-queue wait and preemptions per generated token (from /proc, offline's too), and per
request the stream subscriptions the replica served and the first events it copied onto an open one
(deployments/stream_mux.py; its `get_state` counters), and what the load generator cost this process
per token (CPU, wake-ups, preemptions). The served arms' load generator is by default one asyncio event
loop, the offline arm's (`--client async`; `sync`: blocking clients on a thread per request,
bench/load_client.py).

    python bench/placement_ab.py --model models/target --drafter dspark --num-speculative-tokens 7 \\
        --concurrency 1 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.load_client import CLIENTS, LoadGen, by_thread, client_cost, thread_costs  # noqa: E402
from bench.stream_profile import thread_sched  # noqa: E402
from deployments import thread_policy  # noqa: E402

# What each run records beside tok/s/user, summarised per arm as medians over the rounds.
MEASURES = (
    "ttft_ms",
    "decode_ms_per_token",
    "engine_cpu_ms_per_token",
    "engine_wait_ms_per_token",
    "engine_preempted_per_token",
    "subscriptions_per_request",
    "first_copies_per_request",
    # the load generator (bench/load_client.py): this process less the offline engine's thread
    "client_cpu_us_per_token",
    "client_wakeups_per_token",
    "client_preempted_per_token",
)
ARMS = {"normal": ("normal", False), "batch": ("batch", False), "pinned": ("batch", True)}


def engine_tid(pid: int) -> int:
    (tid,) = [
        int(t.name)
        for t in Path(f"/proc/{pid}/task").iterdir()
        if (t / "comm").read_text().strip() == thread_policy.ENGINE_THREAD_NAME
    ]
    return tid


def place(pids: list[int], engine: int, policy: str, pinned: bool) -> None:
    """Set every thread of `pids` as the arm's AppConfig would from inside, and back for `normal`."""
    cpus = set(os.sched_getaffinity(0))
    engine_cpus, serving_cpus = thread_policy.cpu_split(max(cpus) if pinned else None, cpus)
    for pid in pids:
        for tid, number in thread_policy.plan(policy, thread_policy.threads(pid), keep={engine}).items():
            try:
                os.sched_setscheduler(tid, number, os.sched_param(0))
                os.sched_setaffinity(tid, engine_cpus if tid == engine else serving_cpus)
            except ProcessLookupError:
                continue


def thread_counters(pid: int | str, tid: int) -> tuple[int, int, int]:
    """(ns on a CPU, ns waiting for one, involuntary switches) of one thread so far."""
    return thread_sched(Path(f"/proc/{pid}/task/{tid}"))[:3]


def mux_counts(replica) -> tuple[int, int]:
    """(subscriptions served, first events copied onto one) by the target replica so far."""
    counts = replica.get_state.remote().result()["stream_mux"]
    return counts["subscriptions"], counts["first_copies"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="models/target")
    parser.add_argument("--drafter", default="dspark")
    parser.add_argument("--num-speculative-tokens", type=int, default=7)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--client", choices=CLIENTS, default="async", help="the served arms' load generator")
    parser.add_argument("--out", type=Path, help="write the runs and the summary here (JSON)")
    args = parser.parse_args(argv)

    import asyncio

    import torch
    from ray import serve
    from transformers import AutoTokenizer

    from bench.serve import run_offline, serve_pids, start_stack, summarize
    from drafter_service.demo.corpus import heldout_prompts
    from dspark import AsyncEngine, EngineConfig

    torch.set_num_threads(1)
    model = str(Path(args.model).resolve())
    prompts = heldout_prompts("code", args.prompts, 48, AutoTokenizer.from_pretrained(model))
    engine_options = {
        "drafter": args.drafter,
        "num_speculative_tokens": args.num_speculative_tokens,
        "max_num_seqs": args.concurrency,
    }
    offline = AsyncEngine(EngineConfig(model=model, **engine_options))
    http_url, grpc_target = start_stack(model, engine_options, 1, direct_ingress=True)
    loop = asyncio.new_event_loop()  # the offline arm's, and the async clients'
    clients = LoadGen(args.client, loop, http_url, grpc_target, Path(model).name, args.max_tokens)
    surfaces = ("http", "grpc")
    runs: list[dict] = []
    handle = serve.get_deployment_handle("TargetReplica", "bench")
    try:
        pids = serve_pids()
        replica = pids["replica"][0]
        served = pids["replica"] + pids["ingress"]
        engine = engine_tid(replica)
        run_offline(offline, prompts[:1], args.max_tokens, 1, loop)  # warm every path (connections, imports)
        for surface in surfaces:
            clients.run(surface, prompts[:1], 1)
        order = ["offline", *args.arms]
        for r in range(args.rounds):
            for k in range(len(order)):
                arm = order[(k + r) % len(order)]
                jobs = {"offline": None} if arm == "offline" else surfaces
                if arm != "offline":
                    place(served, engine, *ARMS[arm])
                for surface in jobs:
                    where, tid = ("self", offline.thread_id) if arm == "offline" else (replica, engine)
                    before = thread_counters(where, tid)
                    mux_before = (0, 0) if arm == "offline" else mux_counts(handle)
                    load = os.getloadavg()[0]
                    threads_before = thread_costs(offline.thread_id)
                    client_before = client_cost(offline.thread_id)
                    if arm == "offline":
                        samples, wall = run_offline(offline, prompts, args.max_tokens, args.concurrency, loop)
                    else:
                        samples, wall = clients.run(surface, prompts, args.concurrency)
                    client = client_cost(offline.thread_id) - client_before
                    threads = thread_costs(offline.thread_id)
                    after = thread_counters(where, tid)
                    mux_after = (0, 0) if arm == "offline" else mux_counts(handle)
                    mux = [a - b for a, b in zip(mux_after, mux_before)]
                    tokens = sum(s.tokens for s in samples)
                    cpu, queued, preempted = (a - b for a, b in zip(after, before))
                    point = summarize(samples, wall)
                    runs.append(
                        {
                            "round": r,
                            "arm": arm,
                            "surface": surface or "offline",
                            "tok_s_user": point["tok_s_user"],
                            "ttft_ms": 1000 * point["ttft_s"],
                            # after the first token: what the engine's steps and the stream's hops set
                            "decode_ms_per_token": 1000
                            * statistics.mean((s.seconds - s.ttft) / max(1, s.tokens - 1) for s in samples),
                            "engine_cpu_ms_per_token": cpu / tokens / 1e6,
                            "engine_wait_ms_per_token": queued / tokens / 1e6,
                            "engine_preempted_per_token": preempted / tokens,
                            "subscriptions_per_request": mux[0] / len(samples),
                            "first_copies_per_request": mux[1] / len(samples),
                            **client.per_token(tokens),
                            # [CPU µs, wake-ups, preemptions] per token, by thread name
                            "client_threads": by_thread(threads_before, threads, client, tokens),
                            "client": args.client,
                            "load_1m": load,
                        }
                    )
                    print(json.dumps(runs[-1]), flush=True)
        place(served, engine, "normal", False)
    finally:
        clients.close()
        loop.close()
        offline.shutdown()
        import ray

        serve.shutdown()
        ray.shutdown()

    summary = {}
    for arm in args.arms:
        for surface in surfaces:
            mine = [x for x in runs if x["arm"] == arm and x["surface"] == surface]
            vs = [
                x["tok_s_user"]
                / next(o["tok_s_user"] for o in runs if o["arm"] == "offline" and o["round"] == x["round"])
                - 1
                for x in mine
            ]
            summary[f"{arm}_{surface}"] = {
                "vs_offline_median": statistics.median(vs),
                **{key: statistics.median(x[key] for x in mine) for key in MEASURES},
            }
    offline_runs = [x for x in runs if x["arm"] == "offline"]
    summary["offline"] = {
        key: statistics.median(x[key] for x in offline_runs) for key in ("tok_s_user", *MEASURES)
    }
    print(f"\nconcurrency {args.concurrency}, {args.rounds} rounds, medians:")
    for name, row in summary.items():
        print(
            f"  {name:14s} "
            + ", ".join(f"{k} {v:+.3f}" if k.startswith("vs") else f"{k} {v:.3f}" for k, v in row.items())
        )
    if args.out:
        args.out.write_text(
            json.dumps(
                {"command": sys.argv, "client": args.client, "runs": runs, "summary": summary}, indent=1
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
