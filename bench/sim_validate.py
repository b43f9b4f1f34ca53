"""Validation of the simulator against the real cluster: one seeded workload, both ways.

Real: the demo stack on real Ray Serve (two target replicas with the DSpark drafter, the app's SLA router,
OpenAI HTTP), an open-loop client that starts each request at its arrival time and streams it (ignore_eos,
so every request runs to its max_tokens), measuring TTFT and TPOT per request. It runs twice (or
--real-runs times), each time on a freshly started stack (identical work from an identical state: the
engines' prefix caches start empty), so the report shows how far the real cluster moves between identical
runs beside how far the simulator is from their mean (bench/sim_compare.py). Simulated: the same requests
(arrival, prompt tokens as the target's tokenizer counts them, max_tokens, SLA class, domain) on two
simulated replicas with this machine's profile (sim/profiles/cpu_measured.json), whose SPS table is
replaced by the one the real replicas use (the newest table in the engine's cache after the stack started;
kept where it is that table reshaped to the served forward, Profile.sps_served) and whose engine settings
follow the app's. Reported for each metric: each real run, their spread, simulated, and the differences;
the engines' steps over each run (their counters) beside the simulated replicas'; and TTFT in parts,
serving path (both ways), engine queue and prefill: a real request's from its replica's timing on its last
chunk (bench/ttft_split.py), a simulated one's from its own record (sim.workload.Request.ttft_parts).
The path's way in (arrival to the replica's `received`) is shown beside it, the real runs' from that stamp
(the client and the replicas share the host's monotonic clock) and the simulator's from its requests
(arrival to admitted: with a profile measured by --measure-profile the path splits there, the router
seeing each request at the end of its way in and the first token reaching the client the way back later;
an older profile puts the whole path before the router).
Beside the model as it stands ("sim": the engines share the host with the serving path, whose latency
stretches with the host's contention, sim/host.py), two variants run on the same trace: the path at its
idle latency ("sim_path_at_idle") and each engine alone on its core ("sim_engine_alone").

Then each real run against the model on a machine as much slower than the profile's as that run's was
("speed_matched", bench/sim_compare.py): the factor is the run's stack CPU (its engines' threads and its
serving path's busy cores) over the profile's model of the same work, from the run's CPU accounting, never
its latencies; the simulated machine is that much slower at all its CPU work (the engines' steps,
Group.slow, and the serving path, Profile.path_slowed), under the same seeds. Where the machine's speed
drifts from run to run, this says what of the difference to the runs' mean is the drift and what the model.

Every real request is kept (OUT/sim_validate_requests.json: sent, first token and end at the client, way
in, queue, prefill, its replica, the tokens it generated) and set beside the simulator's request by request
("paired", bench/sim_arrivals.py paired): where a tail parts, which requests make it and with what company.

This machine's speed drifts (more than 2x within an hour has been seen), so a profile measured at another
time than the real runs measures another machine. --measure-profile measures the profile in the same
sitting: between the real runs (after the first of two, the second of four), bench/serving_cost.py's
measurement (its own closed-loop prompts and sweeps, never this trace) runs, then bench/step_noise.py's
(the machine's speed wander) and bench/attention_cost.py's (the forward's price of a padded key), and the
profile is derived from them (bench/cost_profile.py); the simulator then runs on that fresh profile, which
is written with the measurement (its sources name the command and the time it started). The real runs
bracket the measurement, so its time is their mean's.

Run on an idle machine (the real half measures this machine), by bench/sim.py or alone:

    python bench/sim_validate.py --models models --measure-profile   # one sitting, about 7.5 min
    python bench/sim_validate.py [--quick] [--models models] [--drafter dspark]
    python bench/sim_validate.py --sim-only    # the simulator again, against the recorded real runs

which writes bench/results/sim_validate.json (the real requests beside it) and, when bench/results/sim.json
exists, puts the result in its "validation" entry (so `bench/sim.py --skip-validation` and this together
make the full report). With --measure-profile into bench/results, also bench/results/serving_cost.json
and the fresh sim/profiles/cpu_measured.json (elsewhere, e.g. --quick: OUT/serving_cost.json and
OUT/cpu_measured.json).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from anywhere

from bench.http_failure import from_openai  # noqa: E402
from bench.sim import markdown as sim_markdown  # noqa: E402
from bench.sim_compare import METRICS, compare, machine_factor, mean_figures, speed_matched  # noqa: E402
from bench.ttft_split import place, replica_of, timing_of  # noqa: E402
from sim import step_fit  # noqa: E402
from sim.cluster import Cluster, ClusterConfig, Group  # noqa: E402
from sim.metrics import spread, summarize, ttft_split  # noqa: E402
from sim.profiles import PROFILE_DIR, Profile, from_dict, load  # noqa: E402
from sim.scenario import CLASSES  # noqa: E402
from sim.workload import Request, Workload, generate  # noqa: E402

PROFILE = PROFILE_DIR / "cpu_measured.json"
RESULTS = REPO / "bench" / "results"
ENGINE = {
    "drafter": "dspark",
    "num_speculative_tokens": 7,
    "scheduler": "dspark",
    "cost_table_profile": "coarse",
    "max_num_seqs": 16,
    "kv_cache_memory_mb": 256,
}


def workload(quick: bool = False) -> Workload:
    """The validation's seeded workload (--quick: a short one)."""
    rate, duration = (1.0, 6.0) if quick else (3.0, 120.0)
    return Workload(
        rate=rate,
        duration_s=duration,
        seed=7,
        classes={"interactive": 0.5, "standard": 0.5},
        domains={"code": 0.5, "prose": 0.5},
        prompt_median=48,
        prompt_sigma=0.4,
        output_median=48 if quick else 64,
        output_sigma=0.5,
        long_prompt_share=0.0,
        max_prompt=192,
        max_output=192,
    )


def validate(
    models: str,
    quick: bool = False,
    drafter: str = "dspark",
    real_from: dict | None = None,
    between: Callable[[], tuple[Profile, dict]] | None = None,
    runs: int = 2,
    sim_seeds: int = 1,
) -> dict:
    """`drafter` other than dspark (ngram) serves a target without trained drafters: a smoke run only.
    `real_from`: an earlier result of this function whose real figures are taken instead of running the
    real stack again (the simulator's half recomputed against the same seeded workload, on the profile
    that result recorded). `runs`: real runs of the trace (each on a fresh stack). `between`: run in the
    middle of them (after the first of two, the second of four; measure_profile): the profile the
    simulator then runs on, and what the result records of it. `sim_seeds`: the simulator's runs of the
    model as it stands, each under its own seed (its figure their mean, their spread its own noise)."""
    target = Path(models) / "target"
    if not (target / "config.json").is_file() or (
        drafter == "dspark" and not (Path(models) / "drafters" / "dspark").is_dir()
    ):
        return {"skipped": f"no demo models under {models!r} (make models)"}
    engine = {**ENGINE, "drafter": drafter}
    work = workload(quick)
    rate, duration = work.rate, work.duration_s
    warmup = 1.0 if quick else 15.0
    trace = generate(work)
    prompts = _prompts(target, trace)
    classes = CLASSES["cpu_measured"]
    shape = {"rate": rate, "duration_s": duration, "requests": len(trace), "seed": work.seed}
    profile, recorded, timeline = load("cpu_measured"), {"path": _shown(PROFILE)}, []
    if real_from is not None:
        if real_from.get("workload") != shape:
            raise ValueError(f"the earlier real run's workload {real_from.get('workload')} is not {shape}")
        real_runs = [
            {m: v for m, v in zip(METRICS, values)}
            for values in zip(*(real_from[m].get("real_runs") or [real_from[m]["real"]] for m in METRICS))
        ]
        table = _engine_table(real_from.get("sps_table"))
        counters = real_from.get("real_engine_steps")
        counters = counters if isinstance(counters, list) else [counters]
        earlier = real_from.get("profile") or {}
        if earlier.get("path") and (REPO / earlier["path"]).is_file():
            profile, recorded = load(REPO / earlier["path"]), earlier
        timeline = real_from.get("timeline", [])
        real_splits = (real_from.get("ttft_split") or {}).get("real_runs", [])
        real_requests = real_from.get("real_requests")
        real_requests = real_requests if isinstance(real_requests, list) else []  # a name: its file is gone
    else:
        real_runs, counters, real_splits, real_requests = [], [], [], []
        for run in range(runs):
            if run == runs // 2 and between is not None:
                started = time.time()
                profile, recorded = between()
                timeline.append(_span("profile measurement", started))
            started = time.time()
            real, steps, inbound = _run_real(target, trace, prompts, engine)
            timeline.append(_span(f"real run {run + 1}", started))
            real_runs.append(summarize(real, classes, warmup, duration))
            real_requests.append(request_rows(real, inbound))
            scored = [v for r, v in zip(real, inbound) if v is not None and warmup <= r.arrival < duration]
            # Of the path, the way in (arrival to the replica): the replicas share this host's clock.
            real_splits.append({**ttft_split(real, warmup, duration), "inbound_s": spread(scored)})
            counters.append(steps)
        table = _engine_table()
    out = {
        "workload": shape,
        "drafter": drafter,
        "sps_table": table.get("path") if table else "profile's own (no engine table found)",
        # The command that measured the real figures (this one, or the earlier run's with --sim-only).
        "real_measured": real_from.get("real_measured", real_from.get("command"))
        if real_from
        else "this run",
        "profile": recorded,
        "timeline": timeline,
        # Each real run's engine counters, with the profile's model of the same steps (a check of it).
        "real_engine_steps": [engine_steps(c, table, profile, len(trace)) if c else None for c in counters],
    }
    # The model as it stands (the engines share the host with the serving path, whose latency stretches
    # with the host's contention: sim/host.py), the same with the path at its idle latency, and the
    # engine alone on its core (no host block), all against the same real figures.
    sims, splits = {}, {"real_runs": real_splits}
    for label, host in SIM_VARIANTS.items():
        if profile.host is None and host != "none":
            continue  # a profile without a host block has one variant
        requests, replicas = _run_sim(trace, table, profile, host)
        sims[label] = summarize(requests, classes, warmup, duration)
        splits[label] = ttft_split(requests, warmup, duration)
        if label == "sim":
            out["sim_engine_steps"] = sim_steps(replicas, table, profile)
            # Request by request, each real run's against the model's (bench/sim_arrivals.py paired).
            if real_requests:
                from bench.cost_profile import arrival_rows
                from bench.sim_arrivals import paired  # it imports this module

                out["real_requests"] = real_requests
                out["paired"] = [paired(arrival_rows(run), requests, None) for run in real_requests]
    # The model as it stands again under other seeds (its routing, the acceptance drawn, the path's
    # spread): its own noise beside the real runs', and its figure the mean over the seeds.
    seeded = [sims["sim"]] if "sim" in sims else []
    for seed in range(1, sim_seeds if seeded else 1):
        requests, _ = _run_sim(trace, table, profile, "path", seed=seed)
        seeded.append(summarize(requests, classes, warmup, duration))
    # Each real run against the model on a machine as much slower than the profile's as that run's was
    # (bench/sim_compare.py machine_factor: the stack's CPU over the profile's model of it): the machine's
    # speed drifts between runs (their engines' CPU per modelled step has parted by 1.5x in one sitting).
    reading = (out.get("sim_engine_steps") or {}).get("engine_cpu_over_model")
    factors = [machine_factor(c, reading) for c in out["real_engine_steps"]]
    if seeded and factors and None not in factors:
        matched = []
        for factor in factors:
            figures = []
            for seed in range(len(seeded)):
                requests, _ = _run_sim(trace, table, profile, seed=seed, slow=factor["stack"])
                figures.append(summarize(requests, classes, warmup, duration))
            matched.append(mean_figures(figures))
        out["speed_matched"] = speed_matched(real_runs, matched, factors)
    # TTFT in parts (serving path, engine queue, prefill; bench/ttft_split.py), each real run's from its
    # replicas' per-request timing and each variant's from its requests.
    out["ttft_split"] = splits
    return {**out, "sim_seeds": len(seeded) or None, **compare(real_runs, sims, seeded)}


REQUESTS_FILE = "sim_validate_requests.json"  # beside sim_validate.json: each real run's requests
# bench/serving_cost.py's ARRIVAL_COLUMNS (its open-loop runs' rows) and the tokens generated.
REQUEST_COLUMNS = (
    *("sent_s", "first_token_s", "end_s", "inbound_s", "queue_s", "prefill_s", "replica"),
    "generated",
)


def request_rows(real: list[Request], inbound: list[float | None]) -> dict:
    """A real run's requests as bench/serving_cost.py's open-loop runs keep theirs (arrival_run's columns:
    sent, first token and end at the client, way in, the engine's queue and prefill, the replica numbered
    in order of first appearance) with the tokens each generated: in the trace's order, for pairing with
    the simulator's request by request."""
    rows, numbers = [], {}
    for req, way_in in zip(real, inbound):
        queue = prefill = None
        if req.scheduled is not None and req.admitted is not None and req.first_token is not None:
            queue, prefill = req.scheduled - req.admitted, req.first_token - req.scheduled
        replica = None if req.replica is None else numbers.setdefault(req.replica, len(numbers))
        times = (req.arrival, req.first_token, req.finish, way_in, queue, prefill)
        rows.append([*(None if x is None else round(x, 5) for x in times), replica, req.generated])
    return {"columns": list(REQUEST_COLUMNS), "requests": rows}


def requests_json(runs: list[dict]) -> str:
    """The real runs' requests (request_rows each) as JSON, a request to a line."""
    parts = []
    for run in runs:
        rows = ",\n".join(json.dumps(row) for row in run["requests"])
        parts.append(f'{{"columns": {json.dumps(run["columns"])}, "requests": [\n{rows}\n]}}')
    return "[\n" + ",\n".join(parts) + "\n]\n"


# Simulated variants: label -> the host model ("path": the path stretches; "idle_path": the path at its
# idle latency, the engines still sharing the host; "none": no host block, each engine on its own core).
SIM_VARIANTS = {"sim": "path", "sim_path_at_idle": "idle_path", "sim_engine_alone": "none"}


def _span(what: str, started: float) -> dict:
    return {
        "part": what,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "minutes": round((time.time() - started) / 60, 2),
    }


def _shown(path: Path) -> str:
    """A path as the result records it: relative to the repository when inside it."""
    path = Path(path).resolve()
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


STEP_NOISE_S = 60.0  # seconds of bench/step_noise.py's measurement in a sitting (its own default is 30)


def measure_profile(
    models: str,
    quick: bool,
    command: str,
    measurement: Path,
    profile_out: Path,
    noise_out: Path,
    attention_out: Path,
):
    """The validation's `between`: a function that runs bench/serving_cost.py's measurement,
    bench/step_noise.py's (the machine's speed wander: it changes over a day, from a log sd of 0.2 in one
    morning hour to 0.08 in an afternoon one) and bench/attention_cost.py's (the forward's price of a
    padded key), derives the profile from them (bench/cost_profile.py, over the committed profile's
    settings and assumptions), writes all four (at once: a sitting that fails later still leaves a
    consistent set) and gives the profile and what the result records of it."""

    def between() -> tuple[Profile, dict]:
        from bench import attention_cost, step_noise
        from bench.cost_profile import host_check, profile_from
        from bench.serving_cost import QUICK, Settings, measure

        data = measure(models, QUICK if quick else Settings(), command)
        started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        steps = step_noise.measure(Path(models), 3.0 if quick else STEP_NOISE_S)
        noise = {
            "command": f"{command} (its step noise)",
            "started": started,
            "noise": step_noise.noise(steps),
        }
        attention = attention_cost.run(Path(models), 3 if quick else 15, f"{command} (its attention cost)")
        measurement.parent.mkdir(parents=True, exist_ok=True)
        measurement.write_text(json.dumps(data, indent=1) + "\n")
        noise_out.parent.mkdir(parents=True, exist_ok=True)
        noise_out.write_text(json.dumps(noise, indent=1) + "\n")
        step_noise.plot(noise, noise_out.with_suffix(".png"))
        attention_out.write_text(json.dumps(attention, indent=1) + "\n")
        attention_cost.plot(attention, attention_out.with_suffix(".png"))
        fresh = profile_from(data, noise=noise, attention=attention)
        profile_out.parent.mkdir(parents=True, exist_ok=True)
        profile_out.write_text(json.dumps(fresh, indent=1) + "\n")
        recorded = {
            # The host model on the measurement's own engine runs (bench/cost_profile.host_check).
            # The serving path under each run's load too, where the runs recorded it.
            "host_check": host_check(
                data["serving"], fresh["host"], fresh["request_path_s"], fresh.get("request_path_in_s")
            ),
            "path": _shown(profile_out),
            "measurement": _shown(measurement),
            "measured_at": data["measured_at"],
            "measure_minutes": data["wall_minutes"],
            "step_noise": _shown(noise_out),
            "attention_cost": _shown(attention_out),
            "attention_s_per_key": fresh["attention"]["s_per_key"],
            "request_path_s": fresh["request_path_s"],
            "request_path_in_s": fresh.get("request_path_in_s"),
            **{
                k: fresh[k]
                for k in (*step_fit.TERMS, step_fit.CHUNK_TERM, *step_fit.DRAFT_TERMS)
                if k in fresh
            },
        }
        return from_dict(fresh), recorded

    return between


def _prompts(target: Path, trace: list[Request]) -> list[str]:
    """A held-out prompt of each request's domain, cut to its prompt length in the target's tokens."""
    from transformers import AutoTokenizer

    from drafter_service.demo.corpus import heldout_prompts

    tokenizer = AutoTokenizer.from_pretrained(target)
    pool = {d: heldout_prompts(d, 64, 256, tokenizer) for d in ("code", "prose")}
    out = []
    for i, req in enumerate(trace):
        ids = tokenizer.encode(pool[req.domain][i % 64], add_special_tokens=False)[: req.prompt_tokens]
        text = tokenizer.decode(ids)
        # What the engine will see (Engine.tokenize): its length, and its ids for the simulated replicas'
        # prefix caches (several requests share a held-out prompt, cut to different lengths).
        req.prompt_ids = tuple(tokenizer.encode(text, add_special_tokens=False))
        req.prompt_tokens = len(req.prompt_ids)
        out.append(text)
    return out


def _run_real(
    target: Path, trace: list[Request], prompts: list[str], engine: dict
) -> tuple[list[Request], dict]:
    import openai
    import ray
    from ray import serve

    from deployments.app import build_app

    port = _free_port()
    repo = Path(__file__).resolve().parents[1]
    ray.init(
        include_dashboard=False, runtime_env={"env_vars": {"PYTHONPATH": str(repo)}}, log_to_driver=False
    )
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        app = {
            "model": str(target),
            "engine": engine,
            "num_replicas": 2,
            "num_ingress_replicas": 1,
            "torch_num_threads": 1,
            "replica_num_cpus": 0.5,
            "ingress_num_cpus": 0.25,
        }
        serve.run(build_app(app), name="simval", route_prefix="/")
        client = openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="-", max_retries=0, timeout=600
        )
        real = [dataclasses.replace(r) for r in trace]
        from bench.serving_cost import StepWindow

        with StepWindow("simval") as window:
            inbound = asyncio.run(_drive(client, target.resolve().name, real, prompts))
    finally:
        serve.shutdown()
        ray.shutdown()
    return real, window.steps, inbound


def engine_steps(steps: dict, table: dict | None, profile: Profile, requests: int) -> dict:
    """The real engines' steps over a run (bench/serving_cost.StepWindow) with the profile's model of
    the same steps: where a simulated step and a real one part, step by step rather than only in the
    latencies. With the run's wall, its serving load (the stack's busy cores less the engines' threads')
    beside the profile's host block at the run's rates of its `requests`, tokens and steps (a check of
    the host block on a run it was not fitted to)."""
    from bench.serving_cost import engine_model_s

    drop = ("sps_table", "engine_model_s", "engine_cpu_over_model", "serving_load_cores")
    steps = {k: v for k, v in steps.items() if k not in (*drop, "serving_load_model_cores")}
    mean_step = round(steps["step_time_s"] / max(1, steps["steps"]), 5)
    out = {**steps, "mean_step_wall_s": mean_step, **engine_model_s(steps, table, profile)}
    if steps.get("wall_s") and profile.host is not None:
        from bench.cost_profile import run_rate

        rate = run_rate(steps, requests)
        rates = (rate["requests_per_s"], rate["tokens_per_s"], rate["steps_per_s"])
        out["serving_load_cores"] = round(rate["serving_load_cores"], 3)
        out["serving_load_model_cores"] = round(profile.host.load_at(*rates), 3)
    return out


def sim_steps(replicas: list, table: dict | None, profile: Profile) -> dict:
    """The simulated replicas' counters summed, under the real engines' counter names (bench/sim_compare's
    step_view reads both), with the same check of the profile as the real runs': its model at the run's
    mean step over the steps' time alone. The simulated steps read above 1.0 there (1.04 in a trial: the
    mean step is not the mean of the steps, and drafting is in their time), so a real run's reading is
    judged against this one, not against 1."""
    from bench.serving_cost import engine_model_s

    keys = ("steps", "step_time_s", "alone_time_s", "rounds", "forward_tokens", "drafted_tokens")
    keys += ("accepted_tokens", "generated_tokens", "attention_keys")
    out = {k: round(sum(getattr(r.counters, k) for r in replicas), 4) for k in keys}
    model = engine_model_s({**out, "engine_cpu_s": out["alone_time_s"]}, table, profile)
    return {**out, **{k: model[k] for k in ("engine_model_s", "engine_cpu_over_model")}}


async def _drive(client, model: str, requests: list[Request], prompts: list[str]) -> list[float | None]:
    """Each request at its arrival time, streamed; returns each one's way in (its arrival to its
    replica's `received` stamp, None without one), the client and the replicas sharing this host's
    monotonic clock."""
    import openai

    t0 = time.perf_counter()
    t0_monotonic = time.monotonic() - (time.perf_counter() - t0)
    inbound: list[float | None] = [None] * len(requests)

    async def one(index: int, req: Request, prompt: str) -> None:
        await asyncio.sleep(max(0.0, req.arrival - (time.perf_counter() - t0)))
        timing, sent_at = None, time.time()
        try:
            stream = await client.completions.create(
                model=model,
                prompt=prompt,
                max_tokens=req.max_tokens,
                temperature=1.0,
                stream=True,
                stream_options={"include_usage": True},
                extra_body={"ignore_eos": True},
                extra_headers={"x-sla-class": req.sla_class},
            )
            async for chunk in stream:
                now = time.perf_counter() - t0
                if req.first_token is None and chunk.choices and chunk.choices[0].text:
                    req.first_token = now
                timing = timing_of(chunk) or timing
                req.replica = replica_of(chunk) or req.replica
                if chunk.usage is not None:
                    req.generated = chunk.usage.completion_tokens
            req.finish, req.outcome = time.perf_counter() - t0, "done"
            place(req, timing)  # TTFT in parts: the replica's engine spans
            if timing and timing.get("received") is not None:
                inbound[index] = timing["received"] - (t0_monotonic + req.arrival)
        except openai.RateLimitError:
            req.outcome, req.finish = "shed", time.perf_counter() - t0
        except openai.APIStatusError as err:  # no other is expected: say which process answered
            raise from_openai(err, sent_at) from err

    await asyncio.gather(*(one(i, r, p) for i, (r, p) in enumerate(zip(requests, prompts))))
    return inbound


def _engine_table(path: str | None = None) -> dict | None:
    """The SPS table the real replicas use: the newest cached table profiled for these engine settings
    (or the one at `path`, when it is still there)."""
    cache = Path(os.environ.get("DSPARK_CACHE_DIR") or Path.home() / ".cache" / "dspark")
    given = [Path(path)] if path and Path(path).is_file() else []
    for path in given + sorted(cache.glob("sps-*.json"), key=lambda p: p.stat().st_mtime, reverse=True):
        data = json.loads(path.read_text())
        engine = data.get("fingerprint", {}).get("engine", {})
        if (engine.get("max_seqs"), engine.get("gamma"), engine.get("coarse")) == (
            ENGINE["max_num_seqs"],
            ENGINE["num_speculative_tokens"],
            ENGINE["cost_table_profile"] == "coarse",
        ):
            return {
                "path": str(path),
                "points": data["points"],
                "rates": data["smoothed"],
                "fingerprint": data.get("fingerprint"),
            }
    return None


def _run_sim(
    trace: list[Request],
    table: dict | None,
    profile: Profile,
    host: str = "path",
    replicas: int = 2,
    warm: Sequence[tuple[int, ...]] = (),
    seed: int = 0,
    slow: float = 1.0,
) -> tuple[list[Request], list]:
    """The trace on simulated replicas (two, as served); `host`: a SIM_VARIANTS host model; `warm`:
    prompts every replica's prefix cache holds at the start (SimReplica.warm); `seed`: the cluster's;
    `slow`: the machine that much slower than the profile's at all its CPU work (the engines' steps,
    Group.slow, and the serving path, Profile.path_slowed)."""
    cost = profile.host
    if cost is not None and host != "path":
        cost = None if host == "none" else dataclasses.replace(cost, path_stretches=False)
    profile = dataclasses.replace(profile, max_num_seqs=ENGINE["max_num_seqs"], host=cost, cache={})
    profile = profile.path_slowed(slow)
    if table is not None:
        profile = profile.over_table(table["points"], table["rates"])
    requests = [
        dataclasses.replace(
            r,
            replica=None,
            first_token=None,
            finish=None,
            generated=0,
            outcome="pending",
            admitted=None,
            scheduled=None,
            path_back=0.0,
        )
        for r in trace
    ]
    config = ClusterConfig(
        fleet=[Group(profile, replicas, slow=slow)],
        classes=CLASSES["cpu_measured"],
        default_class="standard",
        router="sla",
        seed=seed,
    )
    cluster = Cluster(config, requests)
    for replica in cluster.replicas:
        replica.warm(warm)
    cluster.run(trace[-1].arrival + 600.0 if trace else 0.0)
    return requests, cluster.all_replicas()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a smoke run: 6 s of arrivals at 1 request/s")
    p.add_argument("--models", default="models")
    p.add_argument("--drafter", default="dspark", help="ngram: a stack without trained drafters (smoke)")
    p.add_argument("--out", type=Path, default=None, help="bench/results (build/sim_quick with --quick)")
    p.add_argument(
        "--sim-only",
        action="store_true",
        help="keep the real figures of OUT/sim_validate.json (same workload) and rerun only the simulator",
    )
    p.add_argument(
        "--measure-profile",
        action="store_true",
        help="measure the profile (bench/serving_cost.py, its --quick with --quick) between the real runs "
        "and simulate on it: into OUT/serving_cost.json and PROFILE_OUT",
    )
    p.add_argument(
        "--profile-out",
        type=Path,
        default=None,
        help="sim/profiles/cpu_measured.json when OUT is bench/results, else OUT/cpu_measured.json",
    )
    p.add_argument(
        "--real-runs",
        type=int,
        default=2,
        help="real runs of the trace, each on a fresh stack (about 2.5 min each): their mean is the "
        "reference, their spread the real cluster's own noise",
    )
    p.add_argument(
        "--sim-seeds",
        type=int,
        default=1,
        help="runs of the simulator under their own seeds (seconds each): its figure is their mean, their "
        "spread its own noise",
    )
    args = p.parse_args(argv)
    if args.real_runs < 1 or args.sim_seeds < 1:
        p.error("--real-runs and --sim-seeds must be at least 1")
    if args.sim_only and args.measure_profile:
        p.error("--sim-only keeps the recorded real runs and profile: nothing to measure")
    out = args.out or (REPO / "build" / "sim_quick" if args.quick else RESULTS)
    out.mkdir(parents=True, exist_ok=True)
    command = "python bench/sim_validate.py " + " ".join(argv if argv is not None else sys.argv[1:])
    start = time.time()
    real_from = None
    if args.sim_only:
        real_from = json.loads((out / "sim_validate.json").read_text())
        if (out / REQUESTS_FILE).is_file():  # the real runs' requests, kept apart (below)
            real_from["real_requests"] = json.loads((out / REQUESTS_FILE).read_text())
    between = None
    if args.measure_profile:
        default = PROFILE if out.resolve() == RESULTS.resolve() else out / "cpu_measured.json"
        between = measure_profile(
            args.models,
            args.quick,
            command,
            out / "serving_cost.json",
            args.profile_out or default,
            out / "step_noise.json",
            out / "attention_cost.json",
        )
    result = validate(
        args.models, args.quick, args.drafter, real_from, between, args.real_runs, args.sim_seeds
    )
    result["wall_minutes"] = round((time.time() - start) / 60, 2)
    result["command"] = command
    if result.get("real_measured") == "this run":
        result["real_measured"] = command
    # The real runs' requests go to a file of their own, one line each: thousands of rows would bury the
    # figures (and the report's copy of them in sim.json) line by line.
    requests = result.pop("real_requests", None)
    if requests is not None:
        (out / REQUESTS_FILE).write_text(requests_json(requests))
        result["real_requests"] = REQUESTS_FILE
    (out / "sim_validate.json").write_text(json.dumps(result, indent=1))
    report = out / "sim.json"
    if report.is_file():
        data = json.loads(report.read_text())
        data["validation"] = result
        report.write_text(json.dumps(data, indent=1))
        (out / "sim.md").write_text(sim_markdown(data))  # its table shows the validation too
    print(json.dumps(result, indent=1))
    print("wrote", out / "sim_validate.json", *([report] if report.is_file() else []))


if __name__ == "__main__":
    main()
