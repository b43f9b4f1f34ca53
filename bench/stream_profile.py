"""Where a streamed token's cost goes: messages per token on each hop, and CPU per process.

Starts the same one-replica stack as bench/serve.py, streams `--prompts` requests at `--concurrency`
over HTTP and over gRPC, and counts what crossed each hop: gRPC deltas (one per replica -> ingress ->
proxy -> client message: the ingress forwards each replica event as one delta) and SSE chunks, per
generated token, beside the engine's verify rounds; it prints the Serve flags each serving process runs
with, their CPU while idle, and the CPU time the proxy, the ingress and the replica spent per generated
token (from /proc). With `--py-spy` it also samples one process of each kind during each run and prints
the functions on the stacks that held the GIL, by share of samples. Counts, CPU time and shares, not
wall times, so it reads alike on a busy machine.

    python bench/stream_profile.py --model models/target --drafter ngram --concurrency 8 [--py-spy]
    python bench/stream_profile.py --app '{"num_ingress_replicas": 2}'   # AppConfig fields, as JSON
    python bench/stream_profile.py --direct-ingress --offline   # the engine alone first, as the baseline
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def record(spy: str, pid: int, seconds: float, out: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [spy, "record", "--format", "raw", "--nonblocking", "--gil", "-r", "200"]
        + ["-d", str(max(1, round(seconds))), "-p", str(pid), "-o", str(out)],
        stdout=subprocess.DEVNULL,
    )


def thread_cpu(pids: list[int]) -> collections.Counter:
    """CPU seconds so far of these processes' threads, by (thread name, thread id): Ray's core worker
    and gRPC name their C++ threads (worker.io, client.poll0, ...); Python's threads (the engine's,
    the event loop, thread pools) all carry the process title (ray::IDLE)."""
    tick = os.sysconf("SC_CLK_TCK")
    by_thread: collections.Counter = collections.Counter()
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                head, _, rest = (task / "stat").read_text().rpartition(")")
            except OSError:
                continue
            fields = rest.split()
            by_thread[head.partition("(")[2], task.name] += (int(fields[11]) + int(fields[12])) / tick
    return by_thread


def sched_ns(pid: int) -> dict[str, tuple[int, ...]]:
    """Each thread's CPU and run-queue wait in nanoseconds so far (/proc/.../schedstat), with its
    involuntary context switches (preemptions: by a thread that woke, or at the end of its slice) and
    its moves between CPUs (/proc/.../sched, where the kernel has it; 0 otherwise)."""
    times = {}
    for task in Path(f"/proc/{pid}/task").glob("*"):
        counters = thread_sched(task)
        if counters is not None:
            times[task.name] = counters
    return times


def thread_sched(task: Path) -> tuple[int, int, int, int] | None:
    """One thread's (ns on a CPU, ns waiting for one, involuntary switches, CPU moves) so far, from its
    /proc task directory (the last two 0 where the kernel has no /proc/.../sched); None once it ended."""
    try:
        on_cpu, queued, _ = (task / "schedstat").read_text().split()
    except (OSError, ValueError):
        return None
    counts = dict.fromkeys(("nr_involuntary_switches", "se.nr_migrations"), 0)
    try:
        for line in (task / "sched").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in counts:
                counts[key.strip()] = int(float(value))
    except (OSError, ValueError):
        pass
    return (int(on_cpu), int(queued), *counts.values())


def engine_waits(stats: dict, before: dict, pid: int, sched_before: dict[str, tuple[int, ...]]) -> str:
    """Where the engine thread's step wall time went, per step: on a CPU, waiting for a CPU (run
    queue), and the rest, blocked: at concurrency 1 the engine thread blocks on nothing but the
    interpreter lock (torch runs one thread), so that is its wait for the GIL. The engine thread is
    the one that ran most meanwhile. Approximate: its counters also cover its short work between steps.
    Also its preemptions and CPU moves per step."""
    steps = max(1, stats["steps"] - before["steps"])
    wall = (stats["step_time_s"] - before["step_time_s"]) * 1e9
    spent = {
        tid: tuple(a - b for a, b in zip(now, sched_before.get(tid, (0, 0, 0, 0))))
        for tid, now in sched_ns(pid).items()
    }
    on_cpu, queued, preempted, moved = max(spent.values())
    blocked = max(0.0, wall - on_cpu - queued)
    return (
        f"engine thread per step: on CPU {on_cpu / steps / 1e6:.2f} ms, waiting for a CPU "
        f"{queued / steps / 1e6:.2f} ms, blocked (GIL) {blocked / steps / 1e6:.2f} ms; "
        f"preempted {preempted / steps:.2f}, moved to another CPU {moved / steps:.2f} times"
    )


def policies(pid: int) -> dict[str, int]:
    """How many of a process's threads run under each scheduling policy (AppConfig.serving_thread_policy)."""
    names = {os.SCHED_OTHER: "normal", os.SCHED_BATCH: "batch", os.SCHED_IDLE: "idle"}
    counted: collections.Counter = collections.Counter()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            counted[names.get(os.sched_getscheduler(int(task.name)), "other")] += 1
        except OSError:
            continue
    return dict(counted)


def by_name(spent: collections.Counter, engine: bool) -> collections.Counter:
    """CPU by thread name; with `engine`, the busiest thread (the replica's engine thread, which steps
    the engine) apart from the other Python threads (Serve's request handling and streaming)."""
    spent = collections.Counter(spent)
    named: collections.Counter = collections.Counter()
    if engine and spent:
        busiest = max(spent, key=spent.__getitem__)
        named["engine thread"] = spent.pop(busiest)
    for (name, _), seconds in spent.items():
        named[name] += seconds
    return named


def engine_work(stats: dict, before: dict) -> str:
    """What the engine did between two readings of its stats: generated tokens per step (the batch the
    steps ran at) and step wall time per step, which GIL contention in the replica stretches."""
    steps = stats["steps"] - before["steps"]
    tokens = stats["generated_tokens"] - before["generated_tokens"]
    seconds = stats["step_time_s"] - before["step_time_s"]
    forward = stats["forward_time_s"] - before["forward_time_s"]
    draft = stats["draft_time_s"] - before["draft_time_s"]
    per = 1000 / max(1, steps)
    rest = seconds - forward - draft
    return (
        f"{tokens / max(1, steps):.2f} tokens per step, {seconds * per:.2f} ms per step "
        f"(target forward {forward * per:.2f}, drafting {draft * per:.2f}, the rest {rest * per:.2f})"
    )


def top_functions(raw: Path, n: int = 15) -> list[tuple[str, float]]:
    """Inclusive share of each function over the sampled stacks that held the GIL (collapsed format:
    'a;b;c count'), the stack frames of threads that only wait left out by py-spy's --gil."""
    counts: collections.Counter = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        frames = {f.split(" (")[0] + " (" + f.rsplit("/", 1)[-1] for f in stack.split(";")[1:]}
        for frame in frames:
            counts[frame] += int(count)
        total += int(count)
    return [(f, c / total) for f, c in counts.most_common(n)] if total else []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="models/target")
    parser.add_argument("--drafter", default="ngram")
    parser.add_argument("--num-speculative-tokens", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--app", default="{}", help="more AppConfig fields, as JSON")
    parser.add_argument("--env", nargs="*", default=[], help="KEY=VALUE for every Ray process")
    parser.add_argument("--offline", action="store_true", help="first measure the engine alone, in process")
    parser.add_argument("--py-spy", action="store_true", help="sample the serving processes (needs py-spy)")
    parser.add_argument(
        "--direct-ingress", action="store_true", help="clients call the ingress replica, no Serve proxy"
    )
    args = parser.parse_args(argv)

    import openai
    from ray import serve
    from transformers import AutoTokenizer

    import dspark_client
    from bench.load_client import run_threads
    from bench.serve import cpu_seconds, serve_pids, start_stack  # bench/serve.py
    from drafter_service.demo.corpus import heldout_prompts

    model = str(Path(args.model).resolve())
    tokenizer = AutoTokenizer.from_pretrained(model)
    prompts = heldout_prompts("code", args.prompts, 48, tokenizer)
    engine_options = {
        "drafter": args.drafter,
        "num_speculative_tokens": args.num_speculative_tokens,
        "max_num_seqs": args.concurrency,
    }
    if args.offline:  # the engine alone in this process, same prompts and concurrency: the baseline
        import torch

        from bench.serve import run_offline
        from dspark import AsyncEngine, EngineConfig

        torch.set_num_threads(args.threads)  # as the replica's engine (AppConfig.torch_num_threads)
        engine = AsyncEngine(EngineConfig(model=model, **engine_options))
        try:
            run_offline(engine, prompts[:1], args.max_tokens, 1)  # warm
            cpu, work, threads = time.process_time(), engine.stats.to_dict(), thread_cpu([os.getpid()])
            sched_before = sched_ns(os.getpid())
            samples, wall = run_offline(engine, prompts, args.max_tokens, args.concurrency)
            cpu = time.process_time() - cpu
            threads = thread_cpu([os.getpid()]) - threads
            print(f"[offline] engine: {engine_work(engine.stats.to_dict(), work)}")
            waits = engine_waits(engine.stats.to_dict(), work, os.getpid(), sched_before)
            print(f"[offline] {waits}")
        finally:
            engine.shutdown()
        tokens = sum(s.tokens for s in samples)
        print(f"[offline] {tokens / wall:.0f} tok/s aggregate at concurrency {args.concurrency}")
        print(
            f"[offline] CPU ms per generated token: engine process {1000 * cpu / tokens:.2f} "
            f"(engine thread {1000 * by_name(threads, True)['engine thread'] / tokens:.2f})"
        )
    http_url, grpc_target = start_stack(
        model,
        engine_options,
        args.threads,
        json.loads(args.app),
        dict(kv.split("=", 1) for kv in args.env),
        direct_ingress=args.direct_ingress,
    )
    print(f"clients: HTTP {http_url}, gRPC {grpc_target}")
    replica = serve.get_deployment_handle("TargetReplica", "bench")
    http = openai.OpenAI(base_url=http_url + "/v1", api_key="-", max_retries=0, timeout=600)
    client = dspark_client.Client(grpc_target, timeout_s=600)
    counts = collections.Counter()
    lock = threading.Lock()

    def http_one(prompt: str):
        chunks, tokens = 0, 0
        stream = client_http(prompt)
        for chunk in stream:
            if chunk.choices:
                chunks += 1
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
        with lock:
            counts["http_chunks"] += chunks
            counts["http_tokens"] += tokens

    def client_http(prompt: str):
        return http.completions.create(
            model=Path(model).name,
            prompt=prompt,
            max_tokens=args.max_tokens,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )

    def grpc_one(prompt: str):
        deltas = 0
        with client.stream(prompt, max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True) as stream:
            for _ in stream:
                deltas += 1
        with lock:
            counts["grpc_deltas"] += deltas
            counts["grpc_tokens"] += stream.completion.usage.completion_tokens
            counts["grpc_rounds"] += stream.completion.speculation.rounds

    try:
        run_threads(http_one, prompts[:1], 1)  # warm both paths
        run_threads(grpc_one, prompts[:1], 1)
        counts.clear()
        pids = serve_pids()
        print(f"serving processes: {pids}")
        for name, p in pids.items():  # the Serve flags each process runs with
            env = Path(f"/proc/{p[0]}/environ").read_bytes().split(b"\0")
            flags = sorted(e.decode() for e in env if e.startswith((b"RAY_SERVE_RUN_", b"RAY_SERVE_ENABLE_")))
            print(f"  {name}: {flags}; threads by scheduling policy: {policies(p[0])}")
        before = {name: cpu_seconds(p) for name, p in pids.items()}
        time.sleep(3.0)  # the idle cost: health checks, routing stats, metrics
        idle = {name: (cpu_seconds(p) - before[name]) / 3.0 for name, p in pids.items()}
        print("idle CPU ms per second: " + ", ".join(f"{n} {1000 * t:.0f}" for n, t in idle.items()))
        spy = shutil.which("py-spy", path=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")
        spy = spy if args.py_spy else None
        tmp = Path(tempfile.mkdtemp(prefix="stream_profile_"))
        for label, fn in (("http", http_one), ("grpc", grpc_one)):
            procs = {}
            if spy:
                _, wall = run_threads(fn, prompts, args.concurrency)  # how long to sample for
                procs = {
                    name: record(spy, pid[0], wall, tmp / f"{label}_{name}.txt") for name, pid in pids.items()
                }
                time.sleep(0.5)  # py-spy attaches (the counts below are ratios: two runs count alike)
            before = {name: cpu_seconds(p) for name, p in pids.items()}
            threads_before = {name: thread_cpu(p) for name, p in pids.items()}
            work = replica.get_state.remote().result()["engine"]
            sched_before = sched_ns(pids["replica"][0])
            tokens = counts[f"{label}_tokens"]
            _, wall = run_threads(fn, prompts, args.concurrency)
            tokens = counts[f"{label}_tokens"] - tokens
            cpu = {name: cpu_seconds(p) - before[name] for name, p in pids.items()}
            print(f"[{label}] {tokens / wall:.0f} tok/s aggregate at concurrency {args.concurrency}")
            engine_now = replica.get_state.remote().result()["engine"]
            print(f"[{label}] engine: {engine_work(engine_now, work)}")
            print(f"[{label}] {engine_waits(engine_now, work, pids['replica'][0], sched_before)}")
            print(
                f"[{label}] CPU ms per generated token: "
                + ", ".join(
                    f"{name} ({len(pids[name])} proc) {1000 * t / tokens:.2f}" for name, t in cpu.items()
                )
            )
            for name, p in pids.items():
                spent = thread_cpu(p)
                spent.subtract(threads_before[name])
                busy = [(t, s) for t, s in by_name(spent, name == "replica").most_common(7) if s > 0]
                print(f"  {name} threads: " + ", ".join(f"{t} {1000 * s / tokens:.2f}" for t, s in busy))
            for proc in procs.values():
                proc.wait()
            for name in procs:
                print(f"\n[{label}] {name} (pid {pids[name][0]}): functions by share of GIL-holding samples")
                for func, share in top_functions(tmp / f"{label}_{name}.txt"):
                    print(f"  {share:6.1%}  {func}")
    finally:
        client.close()
        import ray

        serve.shutdown()
        ray.shutdown()
    print(
        f"\nconcurrency {args.concurrency}: per generated token: "
        f"gRPC messages {counts['grpc_deltas'] / max(1, counts['grpc_tokens']):.3f} "
        f"(verify rounds {counts['grpc_rounds'] / max(1, counts['grpc_tokens']):.3f}), "
        f"SSE chunks {counts['http_chunks'] / max(1, counts['http_tokens']):.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
