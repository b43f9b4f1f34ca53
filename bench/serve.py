"""Serving overhead: the same held-out prompts streamed offline, over HTTP and over gRPC.

Offline is the engine in this process (AsyncEngine), driven by one asyncio event loop; HTTP is the
OpenAI API through Ray Serve's proxy (SSE); gRPC is `dspark_client` through Serve's gRPC proxy. The
served arms' load generator (bench/load_client.py, `--client`) is by default the same shape as the
offline arm's, every request a task on that one loop (aiohttp; dspark_client.AsyncClient); `--client
sync` runs the blocking clients (`openai`, dspark_client.Client) on a thread per request instead. With
`--direct-ingress` both clients call the ingress replica's own servers instead, one Ray hop and one
process fewer per streamed message (deployments/direct_ingress.py). The served stack
is one replica with the offline engine's options and one ingress replica (on a machine of a few cores a
second ingress process only takes the engine's CPU), so the difference is the serving path. Each
concurrency level runs every method in rotating order; greedy decoding with a fixed output length
makes every method produce the same tokens. Beside tok/s, each served point records the CPU time the
proxy, the ingress and the replica spent per generated token (from /proc, so it reads alike on a busy
machine) and the messages per token a stream took; every point, offline's too, records what the load
generator cost this process per token (CPU, wake-ups, preemptions: the process less the offline
engine's thread).

    python bench/serve.py --model models/target [--drafter ngram] [--prompts 16] [--max-tokens 64]
    python bench/serve.py --model models/target --direct-ingress   # no Serve proxy in the path
    python bench/serve.py --quick      # a smoke run: tiny sizes, written to a scratch file
    python bench/serve.py --client sync   # the blocking clients on threads, as before

Writes bench/results/serve.json and bench/results/serve.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from tqdm import tqdm

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from anywhere: deployments/ need not be installed

from bench.load_client import CLIENTS, LoadGen, Sample, client_cost, gather  # noqa: E402  (bench/load_client.py)

RESULTS = REPO / "bench" / "results"
METHODS = ("offline", "http", "grpc")


# The serving processes by their Ray process titles.
PROCESSES = {"proxy": "ray::ProxyActor", "ingress": "ServeReplica:bench:Ingress", "replica": "TargetReplica"}
TARGETS = {"c1": 0.10, "c8": 0.15}  # issue 17: tok/s/user overhead against offline, both surfaces


def summarize(samples: list[Sample], wall: float) -> dict:
    return {
        "tok_s_user": statistics.mean(s.tokens / s.seconds for s in samples),
        "tok_s_total": sum(s.tokens for s in samples) / wall,
        "ttft_s": statistics.mean(s.ttft for s in samples),
        "messages_per_token": sum(s.messages for s in samples) / max(1, sum(s.tokens for s in samples)),
        "requests": len(samples),
    }


def own_processes() -> dict[int, str]:
    """The command lines of this process' descendants, by pid (another Ray on the machine is not ours)."""
    parents: dict[int, int] = {}
    cmdlines: dict[int, str] = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace")
            parents[int(entry)] = int(Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        cmdlines[int(entry)] = cmdline

    def ours(pid: int) -> bool:
        while pid > 1:
            if pid == os.getpid():
                return True
            pid = parents.get(pid, 1)
        return False

    return {pid: cmdline for pid, cmdline in cmdlines.items() if ours(pid)}


def serve_pids() -> dict[str, list[int]]:
    """This run's serving processes, by PROCESSES' names."""
    found: dict[str, list[int]] = {}
    for pid, cmdline in own_processes().items():
        for name, title in PROCESSES.items():
            if cmdline.startswith("ray::") and title in cmdline:
                found.setdefault(name, []).append(pid)
    return found


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of these processes so far."""
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def run_offline(
    engine,
    prompts: list[str],
    max_tokens: int,
    concurrency: int,
    loop: asyncio.AbstractEventLoop | None = None,
) -> tuple[list[Sample], float]:
    """The prompts through the engine in this process, on `loop` (the async clients' loop; a fresh one
    when None)."""
    from dspark import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)

    async def one(prompt: str) -> Sample:
        start, first, tokens = time.perf_counter(), None, 0
        async for out in engine.generate(prompt, params):
            first = first or time.perf_counter()
            tokens = len(out.token_ids)
        return Sample(tokens, time.perf_counter() - start, first - start)

    run = gather(one, prompts, concurrency)  # the async clients' gate and clock
    return asyncio.run(run) if loop is None else loop.run_until_complete(run)


def start_stack(
    model: str,
    engine_options: dict,
    threads: int,
    app: dict | None = None,
    env: dict | None = None,
    direct_ingress: bool = False,
) -> tuple[str, str]:
    """One target replica with the offline engine's options; `app`: more AppConfig fields, `env`: more
    environment for every Ray process (Serve's own flags). Returns the HTTP base URL and the gRPC target
    the clients use: Serve's proxy's, or with `direct_ingress` the ingress replica's own
    (deployments/direct_ingress.py)."""
    import ray
    from ray import serve

    from deployments.app import GRPC_SERVICERS, PROXY_ENV, build_app
    from deployments.direct_ingress import LOCAL_DIRECT_INGRESS_ENV, wait_for_endpoints
    from deployments.serve import REPO as repo

    http_port, grpc_port = _free_port(), _free_port()
    extra = {**PROXY_ENV, **(LOCAL_DIRECT_INGRESS_ENV if direct_ingress else {}), **(env or {})}
    ray.init(
        include_dashboard=False,
        runtime_env={"env_vars": {"PYTHONPATH": str(repo), **extra}},
        log_to_driver=False,
    )
    serve.start(
        http_options={"host": "127.0.0.1", "port": http_port},
        grpc_options={"port": grpc_port, "grpc_servicer_functions": GRPC_SERVICERS},
    )
    args = {
        "model": model,
        "engine": engine_options,
        "num_replicas": 1,
        "num_ingress_replicas": 1,
        "torch_num_threads": threads,
        **(app or {}),
    }
    serve.run(build_app(args), name="bench", route_prefix="/")
    if direct_ingress:
        found = wait_for_endpoints("bench", args["num_ingress_replicas"], host="127.0.0.1")
        return found.http[0], found.grpc[0]
    return f"http://127.0.0.1:{http_port}", f"127.0.0.1:{grpc_port}"


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def noise_band(points: list[dict]) -> dict[str, float]:
    """Per concurrency, the widest spread between repeats of identical work (max / min - 1 of tok/s/user
    over one method's repeats, any method): an overhead closer to its target than this is not shown.
    Empty with a single repeat."""
    band: dict[str, float] = {}
    for p in points:
        each = p["tok_s_user_each"]
        if len(each) < 2:  # one repeat measures no spread
            continue
        key = f"c{p['concurrency']}"
        band[key] = round(max(band.get(key, 0.0), max(each) / min(each) - 1), 4)
    return band


def client_cell(point: dict) -> str:
    """What the load generator (bench/load_client.py) cost this process per token; "-" in an older result."""
    if "client_cpu_us_per_token" not in point:
        return "-"
    return f"{point['client_cpu_us_per_token']:.0f}, {point['client_wakeups_per_token']:.2f}"


def table(results: dict) -> str:
    client = results["config"].get("client", "sync")
    lines = [
        f"Load generator: `{client}` clients (bench/load_client.py).",
        "",
        "| concurrency | method | tok/s/user | aggregate tok/s | mean TTFT (s) | tok/s/user vs offline "
        "| messages/token | CPU ms/token: proxy, ingress, replica (offline: its engine) "
        "| load generator: CPU µs, wake-ups per token |",
        "|---:|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for point in results["points"]:
        base = next(
            p["tok_s_user"]
            for p in results["points"]
            if p["method"] == "offline" and p["concurrency"] == point["concurrency"]
        )
        cpu = [point.get(f"cpu_ms_per_token_{name}") for name in PROCESSES]
        cpu_cell = ", ".join("-" if v is None else f"{v:.2f}" for v in cpu)
        if point["method"] == "offline":
            cpu_cell = f"engine {point['cpu_ms_per_token_offline']:.2f}"
        messages = f"{point['messages_per_token']:.3f}" if point["method"] != "offline" else "-"
        lines.append(
            f"| {point['concurrency']} | {point['method']} | {point['tok_s_user']:.1f} | "
            f"{point['tok_s_total']:.1f} | {point['ttft_s']:.3f} | {point['tok_s_user'] / base - 1:+.1%} "
            f"| {messages} | {cpu_cell} | {client_cell(point)} |"
        )
    band = results["summary"].get("noise_band_by_concurrency")
    if band:
        spread = ", ".join(f"{c} {v:.1%}" for c, v in band.items())
        lines += ["", f"Noise band (widest spread of one method's repeats, max / min - 1): {spread}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="models/target")
    parser.add_argument("--drafter", default="ngram")
    parser.add_argument("--num-speculative-tokens", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=48)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the engine, both paths")
    parser.add_argument("--out", type=Path, default=RESULTS / "serve.json")
    parser.add_argument("--quick", action="store_true", help="smoke run: tiny sizes, a scratch output file")
    parser.add_argument(
        "--stream-interval",
        type=int,
        default=1,
        help="tokens per streamed message after the first (AppConfig.stream_interval; 1: every step)",
    )
    parser.add_argument(
        "--no-stream-mux",
        action="store_true",
        help="one Ray stream per request instead of one per ingress->replica pair (AppConfig.stream_mux)",
    )
    parser.add_argument(
        "--stream-mux-transport",
        choices=("socket", "serve"),
        default="socket",
        help="what carries the muxed streams' later events: a direct TCP connection or a Serve call",
    )
    parser.add_argument(
        "--direct-ingress",
        action="store_true",
        help="clients call the ingress replica's own HTTP/gRPC servers, no Serve proxy in the path",
    )
    parser.add_argument(
        "--app",
        type=json.loads,
        default={},
        help="more AppConfig fields of the served app, as JSON (e.g. an A/B arm's setting)",
    )
    parser.add_argument(
        "--client",
        choices=CLIENTS,
        default="async",
        help="the served arms' load generator: async (one event loop, like the offline arm) or sync "
        "(blocking clients on a thread per request; bench/load_client.py)",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.prompts, args.max_tokens, args.repeats, args.concurrency = 2, 8, 1, [1, 2]
        args.out = Path(tempfile.gettempdir()) / "serve_quick.json"

    import torch
    from transformers import AutoTokenizer

    from drafter_service.demo.corpus import heldout_prompts
    from dspark import AsyncEngine, EngineConfig

    torch.set_num_threads(args.threads)
    model = str(Path(args.model).resolve())
    tokenizer = AutoTokenizer.from_pretrained(model)
    half = args.prompts // 2
    prompts = heldout_prompts("code", args.prompts - half, args.prompt_tokens, tokenizer) + heldout_prompts(
        "prose", half, args.prompt_tokens, tokenizer
    )
    engine_options = {
        "drafter": args.drafter,
        "num_speculative_tokens": args.num_speculative_tokens,
        "max_num_seqs": max(args.concurrency),
    }
    offline = AsyncEngine(EngineConfig(model=model, **engine_options))
    http_url, grpc_target = start_stack(
        model,
        engine_options,
        args.threads,
        {
            "stream_interval": args.stream_interval,
            "stream_mux": not args.no_stream_mux,
            "stream_mux_transport": args.stream_mux_transport,
            **args.app,
        },
        direct_ingress=args.direct_ingress,
    )
    loop = asyncio.new_event_loop()  # the offline arm's, and the async clients'
    clients = LoadGen(args.client, loop, http_url, grpc_target, Path(model).name, args.max_tokens)
    runners = {
        "offline": lambda ps, c: run_offline(offline, ps, args.max_tokens, c, loop),
        "http": lambda ps, c: clients.run("http", ps, c),
        "grpc": lambda ps, c: clients.run("grpc", ps, c),
    }
    try:
        for method in METHODS:  # warm every path (first-request imports, connections)
            runners[method](prompts[:1], 1)
        pids = serve_pids()
        collected: dict[tuple[str, int], list] = {}
        jobs = [(c, r) for c in args.concurrency for r in range(args.repeats)]
        for c, r in tqdm(jobs, desc="serve bench"):
            for k in range(len(METHODS)):  # rotate the order so drift hits every method alike
                method = METHODS[(k + r) % len(METHODS)]
                before = {proc: cpu_seconds(p) for proc, p in pids.items()}
                own = time.process_time()  # offline: the engine's thread and its event loop, in this process
                client_before = client_cost(offline.thread_id)
                samples, wall = runners[method](prompts, c)
                run = summarize(samples, wall)
                tokens = sum(s.tokens for s in samples)
                run.update((client_cost(offline.thread_id) - client_before).per_token(tokens))
                if method == "offline":
                    run["cpu_ms_per_token_offline"] = 1000 * (time.process_time() - own) / tokens
                else:  # what each serving process spent per generated token
                    for proc, p in pids.items():
                        run[f"cpu_ms_per_token_{proc}"] = 1000 * (cpu_seconds(p) - before[proc]) / tokens
                collected.setdefault((method, c), []).append(run)
    finally:
        clients.close()
        loop.close()
        offline.shutdown()
        import ray
        from ray import serve

        serve.shutdown()
        ray.shutdown()

    points = [
        {
            "method": method,
            "concurrency": c,
            **{key: statistics.mean(run[key] for run in runs) for key in runs[0] if key != "requests"},
            "tok_s_user_each": [run["tok_s_user"] for run in runs],
        }
        for (method, c), runs in sorted(collected.items(), key=lambda kv: (kv[0][1], METHODS.index(kv[0][0])))
    ]
    overhead = {
        f"{method}_c{c}": 1
        - p["tok_s_user"]
        / next(q["tok_s_user"] for q in points if q["method"] == "offline" and q["concurrency"] == c)
        for p in points
        for method, c in [(p["method"], p["concurrency"])]
        if method != "offline"
    }
    results = {
        "command": "python bench/serve.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "torch_threads": args.threads,
            "load_avg_1m_at_end": os.getloadavg()[0],  # other work on the machine skews served paths most
        },
        "config": {
            **engine_options,
            "prompts": len(prompts),
            "max_tokens": args.max_tokens,
            "repeats": args.repeats,
            "num_ingress_replicas": 1,
            "path": "direct_ingress" if args.direct_ingress else "proxy",
            "client": args.client,
            "stream_interval": args.stream_interval,
            "stream_mux": not args.no_stream_mux,
            "stream_mux_transport": args.stream_mux_transport,
            "app": args.app,
            "serving_processes": {proc: len(p) for proc, p in pids.items()},
        },
        "points": points,
        "summary": {
            "tok_s_user_overhead_vs_offline": overhead,
            "target": TARGETS,
            "noise_band_by_concurrency": noise_band(points),
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(
        f"# Serving overhead\n\n`{results['command']}`\n\n" + table(results)
    )
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
