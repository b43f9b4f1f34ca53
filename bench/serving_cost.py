"""What serving costs the host, per request and per token, and how CPU-bound work shares the cores.

The simulator's replica model steps an engine as if it had its core to itself (sim/profiles/cpu_measured.json
is the engine measured alone). On this machine the served stack also runs Serve's proxy, the ingress, Ray's
own processes and the client on the same cores, and two replicas share two cores. This script measures
those terms so the simulator's host model (sim/host.py) takes them as data:

1. The validation's stack (bench/sim_validate.py: two demo target replicas with the DSpark drafter, one
   ingress, OpenAI HTTP streaming) is started, left idle, then driven twice with the same prompts at the
   same concurrency: once with max_tokens=1 and once with max_tokens=T. The CPU time (from /proc, so it
   reads alike on a busy machine) of every process this run started is split into groups: proxy,
   ingress, the replicas' engine threads (each replica's busiest thread: it steps the engine), the
   replicas' other threads (Serve's request handling and streaming in the engine's process), Ray's other
   processes, and the client (this process). Per request = the max_tokens=1 run's CPU over its
   requests; per token = the difference between the two runs over the difference in generated tokens.
   Idle = CPU per second with no traffic. Before those, a path run sends requests one at a time for one
   token each: their mean TTFT less the engines' mean step wall per request is the serving path's latency
   (the profile's request_path_s, measured on this stack in the same sitting; serving_path), or, when
   every request brought its replica's timing, their mean TTFT less each one's own engine part (received
   to first token: the split the validation makes), split in turn into its way in (sent to the replica's
   `received`, on the host's shared monotonic clock: request_path_in_s) and the first token's way back.
   Every run records its mean TTFT in parts (`ttft_split`, with the path's way in and back): the serving
   path under each run's load, which cost_profile.host_check sets beside the simulator's model of it.
   Then a sweep of runs (--engine-sweep: concurrencies 2 to 12, about 1 to 6 decoding requests per
   replica, and one run with longer prompts) measures the engines themselves: their own counters (steps,
   tokens through the forward, decoding requests per step) beside the engine threads' CPU, their wait for
   a CPU (/proc schedstat's run delay: the host's contention) and the rest of the steps' wall time, off a
   CPU without waiting for one (blocked: the interpreter lock), and the simulator's model of the same
   steps (engine_cpu_over_model: about 1.0 once the profile is fitted to these runs). Then open-loop runs
   (--arrivals: requests arriving as a Poisson process at each rate for --arrivals-s, as served traffic
   arrives, whatever the others are doing) record every request's send, first token, end, way in and
   engine spans (`arrival_runs`): the serving path's latency by the requests open on it when each
   arrived, which the closed loop cannot show (there the same requests stay open and each is replaced
   the moment it ends: at 8 and 12 open its way in read 64 and 129 ms where the validation's open-loop
   trace, with as many open, saw 35-45). --write-profile fits
   the profile's step, request and token overheads to the sweep (sim/step_fit.py) over the SPS table the
   replicas used (recorded here). Last, the replicas are redeployed with the draft gate off and runs at
   --draft-sweep's concurrencies measure the drafter's cost per drafting step (the validation's engines
   gate drafting off in most rounds, so the gated sweep hardly drafts); --write-profile fits the profile's
   drafter terms to them, and the simulated engines' own draft gate decides from those. Each run also
   records the stack's CPU and the whole machine's busy cores (/proc/stat): busy beyond the stack's own
   is other work sharing the machine (CPU per unit of work reads higher then); engines waiting for a CPU
   while the machine is short of its cores busy is scheduling that leaves a core idle, which the host
   model's fair sharing does not have.
2. Core sharing: k copies of one fixed CPU-bound job (a single-threaded torch matmul loop, the kind of
   work a forward is) started together on this machine's cores; each copy's wall time against one copy
   alone. With C cores and k > C runnable jobs, fair sharing predicts a stretch of k / C.

    python bench/serving_cost.py [--quick] [--requests 24] [--max-tokens 48] [--concurrency 4]
                                 [--engine-sweep 2x48,4x48,8x48,12x48,8x144] [--draft-sweep 2x48,8x48]
                                 [--arrivals 2,4] [--arrivals-s 40]
    python bench/serving_cost.py --write-profile   # then: the measured terms into cpu_measured.json

Writes bench/results/serving_cost.json (build/serving_cost_quick.json with --quick), stamped with its
command and start time (`measured_at`); --write-profile (bench/cost_profile.py) derives
sim/profiles/cpu_measured.json's `host` block and `request_path_s` from it (from serve_proxy.json for a
measurement without a path run), and, from the engine sweep, the profile's SPS table (the replicas') and its
step, request and token overheads, and from the draft sweep its drafter terms. The sweeps are
serving_cost's own closed-loop workload, never the validation's trace. bench/sim_validate.py
--measure-profile runs this measurement (measure()) between its two real runs of the validation's trace.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import multiprocessing
import os
import platform
import random
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from anywhere
sys.path.insert(0, str(REPO / "bench"))

from sim_validate import ENGINE, _engine_table, _free_port  # noqa: E402

from sim import step_fit  # noqa: E402
from sim.profiles import Profile, load  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
# Ray process titles -> group; what is not named here and was started by this run is "ray_other".
TITLES = {"ray::ProxyActor": "proxy", "Ingress": "ingress", "TargetReplica": "replica"}


def _stat(path: str) -> tuple[int, float] | None:
    """(parent pid, user + system CPU seconds) of a /proc stat file."""
    try:
        fields = Path(path).read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / TICK


def cpu_by_group() -> dict[str, float]:
    """CPU seconds so far of every process this run started (descendants of this one), by group; each
    replica's threads are listed apart as "tid:<pid>/<tid>" (see split_engine)."""
    parents, cmdlines = {}, {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        stat = _stat(f"/proc/{entry}/stat")
        if stat is None:
            continue
        parents[int(entry)] = stat[0]
        try:
            cmdlines[int(entry)] = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            cmdlines[int(entry)] = ""

    def ours(pid: int) -> bool:
        while pid > 1:
            if pid == os.getpid():
                return True
            pid = parents.get(pid, 1)
        return False

    groups = dict.fromkeys(("proxy", "ingress", "ray_other"), 0.0)
    groups["client"] = time.process_time()
    for pid, cmdline in cmdlines.items():
        if pid == os.getpid() or not ours(pid):
            continue
        group = next(
            (g for title, g in TITLES.items() if cmdline.startswith("ray::") and title in cmdline), None
        )
        if group != "replica":
            groups[group or "ray_other"] += (_stat(f"/proc/{pid}/stat") or (0, 0.0))[1]
            continue
        for tid in os.listdir(f"/proc/{pid}/task"):
            groups[f"tid:{pid}/{tid}"] = (_stat(f"/proc/{pid}/task/{tid}/stat") or (0, 0.0))[1]
            groups[f"wait:{pid}/{tid}"] = _run_delay(f"/proc/{pid}/task/{tid}/schedstat")
    return groups


def _run_delay(path: str) -> float:
    """Seconds a thread has been runnable but waiting for a CPU (/proc schedstat's second field)."""
    try:
        return int(Path(path).read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def split_engine(spent: dict[str, float]) -> dict[str, float]:
    """A run's CPU by group, each replica's threads summed into its engine thread and the rest. The engine
    thread is the replica's busiest over the run (with one torch thread it runs every forward and draft;
    Python 3.11 does not give threads OS names to tell it by)."""
    out = {k: v for k, v in spent.items() if not k.startswith(("tid:", "wait:"))}
    out["engine"] = out["replica_other"] = 0.0
    by_pid: dict[str, dict[str, float]] = {}
    for key, value in spent.items():
        if key.startswith("tid:"):
            pid, tid = key[4:].split("/")
            by_pid.setdefault(pid, {})[tid] = value
    waits = {}
    for pid, threads in by_pid.items():
        engine = max(threads, key=threads.get)
        out["engine"] += threads[engine]
        out["replica_other"] += sum(threads.values()) - threads[engine]
        waits[pid] = spent.get(f"wait:{pid}/{engine}", 0.0)
    if waits:  # the engine threads' time runnable but off a CPU (not a CPU-time group: kept apart)
        out["engine_run_delay"] = sum(waits.values())
    return out


def _diff(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return split_engine({k: after[k] - before.get(k, 0.0) for k in after})


async def _stream(client, model: str, prompt: str, max_tokens: int) -> dict:
    """One request streamed to its end (ignore_eos: it runs to max_tokens): the tokens it got, when it was
    sent (perf_counter), its time to its first token and to its end from then, its engine spans (queue,
    prefill; bench/ttft_split.py) from its replica's timing and its way in (sent to its replica's
    `received` stamp: the client and the replicas share this host's monotonic clock), None without a
    timing, and the replica that ran it (None if unnamed)."""
    import openai

    from bench.http_failure import from_openai
    from bench.ttft_split import engine_spans, replica_of, timing_of

    timing = replica = None
    sent, sent_monotonic, sent_at = time.perf_counter(), time.monotonic(), time.time()
    try:
        stream = await client.completions.create(
            model=model,
            prompt=prompt,
            max_tokens=max_tokens,
            temperature=1.0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
            extra_headers={"x-sla-class": "standard"},
        )
    except openai.APIStatusError as err:  # none is expected: say which process answered
        raise from_openai(err, sent_at) from err
    tokens, ttft = 0, None
    async for chunk in stream:
        if ttft is None and chunk.choices and chunk.choices[0].text:
            ttft = time.perf_counter() - sent
        timing = timing_of(chunk) or timing
        replica = replica_of(chunk) or replica
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    end = time.perf_counter() - sent
    received = (timing or {}).get("received")
    return {
        "replica": replica,
        "tokens": tokens,
        "sent": sent,
        "ttft": ttft if ttft is not None else end,
        "end": end,
        "spans": engine_spans(timing),
        "inbound": None if received is None else received - sent_monotonic,
    }


def _client(base_url: str):
    import openai

    return openai.AsyncOpenAI(base_url=base_url, api_key="-", max_retries=0, timeout=600)


async def _drive(
    base_url: str, model: str, prompts: list[str], max_tokens: int, concurrency: int
) -> tuple[int, list[float], list[tuple[float, float] | None], list[float | None]]:
    """Every prompt streamed, `concurrency` at a time (a closed loop); returns the tokens generated and
    each request's time to its first token, engine spans and way in (_stream)."""
    # A client per event loop: its connections belong to the loop that opened them.
    client = _client(base_url)
    gate = asyncio.Semaphore(concurrency)

    async def one(prompt: str) -> dict:
        async with gate:
            return await _stream(client, model, prompt, max_tokens)

    try:
        done = await asyncio.gather(*(one(p) for p in prompts))
        tokens = sum(d["tokens"] for d in done)
        return tokens, [d["ttft"] for d in done], [d["spans"] for d in done], [d["inbound"] for d in done]
    finally:
        await client.close()


async def _drive_arrivals(
    base_url: str, model: str, prompts: list[str], max_tokens: int, rate: float, duration_s: float, seed: int
) -> list[dict]:
    """Requests arriving as a Poisson process at `rate` per second for `duration_s` (an open loop, as
    served traffic arrives: each request is sent at its time whatever the others are doing), the prompts
    in turn; returns each one's _stream record with `sent` from the start of the run."""
    rng = random.Random(seed)
    times, t = [], rng.expovariate(rate)
    while t < duration_s:
        times.append(t)
        t += rng.expovariate(rate)
    client = _client(base_url)
    start = time.perf_counter()

    async def one(at: float, prompt: str) -> dict:
        await asyncio.sleep(max(0.0, at - (time.perf_counter() - start)))
        record = await _stream(client, model, prompt, max_tokens)
        return {**record, "sent": record["sent"] - start}

    try:
        return list(await asyncio.gather(*(one(at, prompts[i % len(prompts)]) for i, at in enumerate(times))))
    finally:
        await client.close()


@dataclasses.dataclass(frozen=True)
class Settings:
    """What one measurement runs (the defaults are the full size; QUICK is a smoke run)."""

    requests: int = 24
    max_tokens: int = 48
    concurrency: int = 4
    idle_s: float = 5.0
    sweep: tuple[tuple[int, int], ...] = ((2, 48), (4, 48), (8, 48), (12, 48), (8, 144))
    draft_sweep: tuple[tuple[int, int], ...] = ((2, 48), (8, 48))
    # Open-loop runs: requests arriving at these rates (per second) for arrivals_s each, as served traffic
    # arrives: the serving path's latency by the requests open on it (cost_profile.path_beyond).
    arrivals: tuple[float, ...] = (2.0, 4.0)
    arrivals_s: float = 40.0
    path_requests: int = 16  # sent one at a time: the serving path's latency beside the engine's step
    sharing_iterations: int = 3000


QUICK = Settings(
    requests=4,
    max_tokens=8,
    concurrency=2,
    idle_s=1.0,
    sweep=((1, 48), (2, 48), (4, 48), (4, 144)),  # the step fit has 4 terms: 4 runs at least
    draft_sweep=((1, 48), (4, 48)),
    arrivals=(2.0,),
    arrivals_s=4.0,
    path_requests=4,
    sharing_iterations=300,
)


def measure(models: str, settings: Settings, command: str, skip_serving: bool = False) -> dict:
    """The whole measurement (serving_cost.json's contents), stamped with the command and the UTC time it
    started: the profile derived from it names both."""
    start = time.time()
    result = {
        "command": command,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start)),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "engine": ENGINE,
        "sharing": measure_sharing(4, settings.sharing_iterations),
    }
    if not skip_serving:
        result["serving"] = measure_serving(models, settings)
    result["load_avg_1m_at_end"] = os.getloadavg()[0]
    result["wall_minutes"] = round((time.time() - start) / 60, 2)
    return result


def measure_serving(models: str, settings: Settings) -> dict:
    import ray
    from ray import serve
    from transformers import AutoTokenizer

    from deployments.app import build_app
    from drafter_service.demo.corpus import heldout_prompts

    requests, max_tokens, concurrency = settings.requests, settings.max_tokens, settings.concurrency
    idle_s, sweep, draft_sweep = settings.idle_s, settings.sweep, settings.draft_sweep
    arrivals_s = settings.arrivals_s
    target = (Path(models) / "target").resolve()
    tokenizer = AutoTokenizer.from_pretrained(target)
    half = requests // 2

    def prompts_of(length: int) -> list[str]:
        return heldout_prompts("code", requests - half, length, tokenizer) + heldout_prompts(
            "prose", half, length, tokenizer
        )

    prompts = prompts_of(48)
    port = _free_port()
    ray.init(
        include_dashboard=False, runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}}, log_to_driver=False
    )
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        app = {
            "model": str(target),
            "engine": ENGINE,
            "num_replicas": 2,
            "num_ingress_replicas": 1,
            "torch_num_threads": 1,
            "replica_num_cpus": 0.5,
            "ingress_num_cpus": 0.25,
        }
        serve.run(build_app(app), name="servingcost", route_prefix="/")
        base_url = f"http://127.0.0.1:{port}/v1"

        def run(
            max_t: int, streams: int = concurrency, label: str = "", texts: list[str] = prompts
        ) -> tuple[dict, int, float, list[float]]:
            with StepWindow("servingcost") as window:
                drive = _drive(base_url, target.name, texts, max_t, streams)
                tokens, ttfts, spans, inbound = asyncio.run(drive)
            steps[label] = window.steps
            if label:
                split[label] = ttft_split(ttfts, spans, inbound)
            return window.spent, tokens, window.wall_s, ttfts

        steps: dict[str, dict] = {}
        split: dict[str, dict | None] = {}
        run(2)  # warm every path (first-request imports, connections, the cost table)
        # One request at a time, one token each: the serving path's latency beside the engine's step.
        path_ttfts = run(1, 1, "path", (prompts * settings.path_requests)[: settings.path_requests])[3]
        before = cpu_by_group()
        time.sleep(idle_s)  # a measurement window, not a wait for something to happen
        idle = {k: v / idle_s for k, v in _diff(cpu_by_group(), before).items()}
        short, short_tokens, short_wall, _ = run(1)
        long, long_tokens, long_wall, _ = run(max_tokens, label="long")
        for streams, length in sweep:  # the engines across batch sizes and prompt lengths
            run(max_tokens, streams, sweep_label(streams, length), prompts_of(length))
        arrival_runs = {}
        for seed, rate in enumerate(settings.arrivals):  # the path under open-loop traffic
            label = arrival_label(rate)
            with StepWindow("servingcost") as window:
                drive = _drive_arrivals(base_url, target.name, prompts, max_tokens, rate, arrivals_s, seed)
                records = asyncio.run(drive)
            steps[label] = window.steps
            split[label] = ttft_split(*([r[k] for r in records] for k in ("ttft", "spans", "inbound")))
            arrival_runs[label] = arrival_run(rate, settings.arrivals_s, records)
        if draft_sweep:  # the drafter's cost: the same engines drafting every round
            gate_off = {**app, "engine": {**ENGINE, "draft_gate": False}}
            serve.run(build_app(gate_off), name="servingcost", route_prefix="/")
            run(2)  # warm the redeployed replicas
            for streams, length in draft_sweep:
                run(max_tokens, streams, sweep_label(streams, length, "draft"), prompts_of(length))
    finally:
        serve.shutdown()
        ray.shutdown()
    for spent in (idle, short, long):  # a wait, not CPU time: reported beside the engine's steps
        spent.pop("engine_run_delay", None)
    # Idle CPU runs under both runs alike: take it out before splitting per request and per token.
    short = {k: v - idle[k] * short_wall for k, v in short.items()}
    long = {k: v - idle[k] * long_wall for k, v in long.items()}
    per_request = {k: v / requests for k, v in short.items()}
    per_token = {k: (long[k] - short[k]) / (long_tokens - short_tokens) for k in long}
    table = _engine_table()
    return {
        "requests": requests,
        "max_tokens": max_tokens,
        "concurrency": concurrency,
        "tokens": {"short": short_tokens, "long": long_tokens},
        "wall_s": {"short": round(short_wall, 3), "long": round(long_wall, 3)},
        "idle_cores": {k: round(v, 5) for k, v in idle.items()},
        "cpu_s_per_request": {k: round(v, 6) for k, v in per_request.items()},
        "cpu_s_per_token": {k: round(v, 6) for k, v in per_token.items()},
        "path": serving_path(path_ttfts, steps["path"], split["path"]),
        # Each run's mean TTFT in parts (ttft_split): the serving path measured under each run's load.
        "ttft_split": split,
        # The engines' steps in the long run (at `concurrency`) and in the sweep's runs, with the
        # simulator's model of the same steps: the served engine's cost.
        "engine_steps": {k: {**v, **engine_model_s(v, table)} for k, v in steps.items() if k},
        "engine_sweep": [sweep_label(c, p) for c, p in sweep],
        "draft_sweep": [sweep_label(c, p, "draft") for c, p in draft_sweep],
        # The open-loop runs, request by request (arrival_run).
        "arrival_runs": arrival_runs,
        # The SPS table the replicas used (the engine's cache on this machine): the fit's forward term.
        "sps_table": table,
    }


def serving_path(ttfts: list[float], steps: dict, split: dict | None = None) -> dict:
    """The serving path's latency to the first token beside the engine's work, from requests sent one at a
    time for one token each: their mean TTFT at the client less the engine's part. With every request's
    timing from its replica (`split`, ttft_split), that part is each request's own (received to its first
    token: `engine_s`), the same split the validation makes of the real runs' TTFT; without it, the
    engines' mean step wall per request (each such request is one prefill step; `engine_steps` says how
    many ran). It is the serving path the simulator adds to a request's TTFT (the profile's
    request_path_s), measured on the validation's own stack and in the same sitting as the rest; when
    every request also brought its way in (`split`'s path_in_s), the path splits into that
    (request_path_in_s: the simulator's router sees the request at its end) and the first token's way
    back (request_path_back_s, the rest)."""
    n = len(ttfts)
    ttft, engine = sum(ttfts) / n, steps["step_time_s"] / n
    out = {
        "requests": n,
        "engine_steps": int(steps["steps"]),
        "ttft_s": round(ttft, 5),
        "engine_step_s": round(engine, 5),
        "request_path_s": round(ttft - engine, 4),
    }
    if split is not None and split["requests"] == n:
        out.update(engine_s=split["engine_s"], request_path_s=round(split["path_s"], 4))
        if "path_in_s" in split:
            inbound = round(split["path_in_s"], 4)
            out.update(
                request_path_in_s=inbound, request_path_back_s=round(out["request_path_s"] - inbound, 4)
            )
    return out


def ttft_split(
    ttfts: list[float], spans: list[tuple[float, float] | None], inbound: list[float | None] | None = None
) -> dict | None:
    """A run's mean TTFT in parts over its requests with their replica's timing (bench/ttft_split.py):
    the engine's (queue, prefill, both) and the serving path's, the rest (None: no request had one);
    when every one of them has its way in (`inbound`), the path's way in and its way back (the rest)."""
    inbound = inbound if inbound is not None else [None] * len(ttfts)
    timed = [(t, s, i) for t, s, i in zip(ttfts, spans, inbound) if s is not None]
    if not timed:
        return None
    n = len(timed)
    queue, prefill = (sum(s[i] for _, s, _ in timed) / n for i in (0, 1))
    ttft = sum(t for t, _, _ in timed) / n
    out = {
        "requests": n,
        "ttft_s": round(ttft, 5),
        "queue_s": round(queue, 5),
        "prefill_s": round(prefill, 5),
        "engine_s": round(queue + prefill, 5),
        "path_s": round(ttft - queue - prefill, 5),
    }
    if all(i is not None for _, _, i in timed):
        path_in = sum(i for _, _, i in timed) / n
        out.update(path_in_s=round(path_in, 5), path_back_s=round(ttft - queue - prefill - path_in, 5))
    return out


def arrival_label(rate: float) -> str:
    return f"arrivals_r{rate:g}"


def arrival_run(rate: float, duration_s: float, records: list[dict]) -> dict:
    """An open-loop run's requests, each as [sent, its first token, its end] (seconds from the run's
    start; the first token and the end as the client saw them), its way in and its engine's queue and
    prefill (None without its replica's timing), and its replica (None if unnamed): numbered in the order
    they first appear, since their ids mean nothing beyond the run's stack."""
    rows, numbers = [], {}
    for r in records:  # in the order they were dealt their prompts (sim_arrivals.trace_of relies on it)
        spans = r["spans"] or (None, None)
        first, end = r["sent"] + r["ttft"], r["sent"] + r["end"]
        replica = None if r.get("replica") is None else numbers.setdefault(r["replica"], len(numbers))
        rows.append([*(_r(x) for x in (r["sent"], first, end, r["inbound"], *spans)), replica])
    return {"rate": rate, "duration_s": duration_s, "columns": list(ARRIVAL_COLUMNS), "requests": rows}


ARRIVAL_COLUMNS = ("sent_s", "first_token_s", "end_s", "inbound_s", "queue_s", "prefill_s", "replica")


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 5)


def sweep_label(concurrency: int, prompt_tokens: int, kind: str = "engine") -> str:
    return f"{kind}_c{concurrency}_p{prompt_tokens}"


def parse_sweep(text: str) -> tuple[tuple[int, int], ...]:
    """'2x48,8x144' -> ((2, 48), (8, 144)): concurrency x prompt tokens per run."""
    return tuple((int(c), int(p)) for c, p in (item.split("x") for item in text.split(",") if item))


ENGINE_COUNTERS = (
    "steps",
    "step_time_s",
    "forward_time_s",
    "generated_tokens",
    "forward_tokens",
    "prompt_chunks",
    "attention_keys",
    "attention_query_keys",
    "rounds",
    "drafted_tokens",
    "draft_time_s",
    "gated_rounds",
    "accepted_tokens",
    # The steps that ran a prompt chunk, apart (sim/step_fit.py EngineRun.split_counters).
    "prefill_steps",
    "prefill_step_time_s",
    "prefill_step_forward_tokens",
    "prefill_step_attention_keys",
    "prefill_step_attention_query_keys",
    "prefill_step_rounds",
    "prefill_step_draft_time_s",
)


def engine_counters(app_name: str, replicas: int = 2) -> dict[str, float]:
    """The engines' own counters, summed over every replica (each asked until all have answered)."""
    from ray import serve

    handle = serve.get_deployment_handle("TargetReplica", app_name)
    seen: dict[str, dict] = {}
    for _ in range(50 * replicas):
        state = handle.get_state.remote().result()
        seen[state["replica_id"]] = state["engine"]
        if len(seen) == replicas:
            break
    return {k: sum(e[k] for e in seen.values()) for k in ENGINE_COUNTERS}


class StepWindow:
    """The engines' steps over a block of work (`with StepWindow(app) as w: ...`), read from outside the
    replicas: `steps`, their counters' increase with where the stepping time went (engine_time), the
    machine's busy cores and the stack's own; `spent`, the CPU by group (split_engine); `wall_s`."""

    def __init__(self, app_name: str) -> None:
        self.app_name = app_name

    def __enter__(self) -> StepWindow:
        self._counters, self._cpu = engine_counters(self.app_name), cpu_by_group()
        self._busy, self._start = machine_busy_s(), time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is not None:
            return
        self.spent, self.wall_s = _diff(cpu_by_group(), self._cpu), time.perf_counter() - self._start
        stack = sum(v for k, v in self.spent.items() if k != "engine_run_delay")
        self.steps = {
            **engine_time(engine_counters(self.app_name), self._counters, self.spent),
            "machine_busy_cores": round((machine_busy_s() - self._busy) / self.wall_s, 3),
            "stack_cores": round(stack / self.wall_s, 3),
            "wall_s": round(self.wall_s, 3),
        }


def machine_busy_s() -> float:
    """CPU seconds the whole machine has been busy (every process, ours or not: /proc/stat)."""
    ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / TICK  # all but idle and iowait


def engine_model_s(run: dict, table: dict | None, profile: Profile | None = None) -> dict:
    """The simulator's engine model (sim/profiles/cpu_measured.json's step terms as they stand, over the
    SPS table the replicas use) for a run's steps, taken at the run's mean tokens and decoding requests per
    step, as plain decoding (the draft gate declines almost every round on this machine: `drafted_tokens`).
    A check of the profile (`profile`, a sim.profiles.Profile; the committed one by default): about 1.0
    once its terms are fitted to these runs."""
    profile = _with_table(profile or load("cpu_measured"), table)
    steps = max(1, run["steps"])
    tokens, requests = run["forward_tokens"] / steps, run["rounds"] / steps
    # The forwards' padded keys, where the engine counted them and the profile prices them.
    padding = (
        (run["attention_keys"] / steps, run["attention_query_keys"] / steps)
        if run.get("attention_keys") and run.get("attention_query_keys")
        else None
    )
    chunks = run.get("prompt_chunks", 0) / steps
    step = profile.step_seconds(max(1, round(tokens)), requests, 0, profile.cost_table(), padding, chunks)
    return {
        "sps_table": table["path"] if table else "profile's own",
        "engine_model_s": round(step * run["steps"], 4),
        "engine_cpu_over_model": round(run["engine_cpu_s"] / (step * steps), 4),
    }


def _with_table(profile, table: dict | None):
    """The profile over the replicas' SPS table (its own when none is given, or when it is the served
    forward's already: Profile.over_table)."""
    return profile if table is None else profile.over_table(table["points"], table["rates"])


def engine_time(after: dict[str, float], before: dict[str, float], spent: dict[str, float]) -> dict:
    """Where the engines' stepping time went over a run: the engine threads' CPU, their wait for a CPU
    (runnable, off a core: the host's contention) and the rest of the step's wall time, off a CPU without
    waiting for one (blocked: the interpreter lock held by the replica's other threads, the only lock
    the engine thread takes during a step)."""
    d = {k: after[k] - before[k] for k in ENGINE_COUNTERS}
    wall, cpu, queued = d["step_time_s"], spent["engine"], spent.get("engine_run_delay", 0.0)
    return {
        **{k: round(v, 4) for k, v in d.items()},
        "engine_cpu_s": round(cpu, 4),
        "engine_run_delay_s": round(queued, 4),
        "engine_blocked_s": round(wall - cpu - queued, 4),
        "replica_other_cpu_s": round(spent["replica_other"], 4),
    }


def _job(iterations: int, start, out) -> None:
    import torch

    torch.set_num_threads(1)
    a = torch.randn(192, 192)
    start.wait()
    t0 = time.perf_counter()
    for _ in range(iterations):
        a = torch.tanh(a @ a)
    out.put(time.perf_counter() - t0)


def measure_sharing(max_jobs: int, iterations: int) -> dict:
    """Wall time of k identical single-threaded CPU-bound jobs run together, against one alone."""
    ctx = multiprocessing.get_context("spawn")
    walls = {}
    for k in range(1, max_jobs + 1):
        start, out = ctx.Event(), ctx.Queue()
        procs = [ctx.Process(target=_job, args=(iterations, start, out)) for _ in range(k)]
        for p in procs:
            p.start()
        time.sleep(1.0)  # let every copy import torch before the common start (not a wait on a result)
        start.set()
        times = [out.get() for _ in procs]
        for p in procs:
            p.join()
        walls[k] = sum(times) / k
    cores = os.cpu_count() or 1
    return {
        "cores": cores,
        "iterations": iterations,
        "alone_s": round(walls[1], 4),
        "stretch": {k: round(w / walls[1], 4) for k, w in walls.items()},
        "fair_share_prediction": {k: round(max(1.0, k / cores), 4) for k in walls},
        "load_avg_1m": os.getloadavg()[0],
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a smoke run: 4 requests of 8 tokens, short sharing")
    p.add_argument("--models", default="models")
    full = Settings()
    p.add_argument("--requests", type=int, default=full.requests)
    p.add_argument("--max-tokens", type=int, default=full.max_tokens)
    p.add_argument("--concurrency", type=int, default=full.concurrency)
    p.add_argument(
        "--engine-sweep",
        type=parse_sweep,
        default=full.sweep,
        help="runs measuring the engines, concurrency x prompt tokens (the step terms' fit points)",
    )
    p.add_argument(
        "--draft-sweep",
        type=parse_sweep,
        default=full.draft_sweep,
        help="runs with the draft gate off, concurrency x prompt tokens (the drafter terms' fit points)",
    )
    p.add_argument(
        "--arrivals",
        type=lambda text: tuple(float(r) for r in text.split(",") if r),
        default=full.arrivals,
        help="open-loop runs' arrival rates, requests per second (the serving path's queueing)",
    )
    p.add_argument("--arrivals-s", type=float, default=full.arrivals_s)
    p.add_argument("--idle-s", type=float, default=full.idle_s)
    p.add_argument("--path-requests", type=int, default=full.path_requests)
    p.add_argument("--sharing-iterations", type=int, default=full.sharing_iterations)
    p.add_argument("--skip-serving", action="store_true", help="only the core-sharing measurement")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument(
        "--write-profile", action="store_true", help="only derive cpu_measured.json's host block from OUT"
    )
    args = p.parse_args(argv)
    settings = QUICK
    if not args.quick:
        settings = Settings(
            requests=args.requests,
            max_tokens=args.max_tokens,
            concurrency=args.concurrency,
            idle_s=args.idle_s,
            sweep=tuple(args.engine_sweep),
            draft_sweep=tuple(args.draft_sweep),
            arrivals=tuple(args.arrivals),
            arrivals_s=args.arrivals_s,
            path_requests=args.path_requests,
            sharing_iterations=args.sharing_iterations,
        )
    out = args.out or (
        REPO / "build" / "serving_cost_quick.json"
        if args.quick
        else REPO / "bench" / "results" / "serving_cost.json"
    )
    if args.write_profile:
        # Imported here: bench/ leads sys.path, and its sim.py shadows the `sim` package unless that is
        # already imported (it is by now).
        from bench.cost_profile import write_profile

        profile = write_profile(out)
        shown = ("host", "request_path_s", *step_fit.TERMS, *step_fit.DRAFT_TERMS)
        print(json.dumps({k: profile.get(k) for k in shown}, indent=1))
        return
    command = "python bench/serving_cost.py " + " ".join(argv if argv is not None else sys.argv[1:])
    result = measure(args.models, settings, command, args.skip_serving)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    print("wrote", out)


if __name__ == "__main__":
    main()
