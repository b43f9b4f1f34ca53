"""Routing under SLA load: Ray Serve's power-of-two and round-robin routers against the SLA router.

Real Ray Serve on this machine: one ingress and two target replicas (build_app, the gRPC surface), in
these settings (bench/route_workload.py setting_engines; every replica runs the drafter at a fixed
block, --drafter, --num-speculative-tokens, scheduler fixed, unless the setting says otherwise):
  heterogeneous:    replica 0 has --max-num-seqs sequence slots, replica 1 --small-max-num-seqs: one
                    big replica, one small, behind the deployment's one max_ongoing_requests (the big
                    one's, as a user would set it), so Serve's routers send the small one requests it
                    has no slot for, and it refuses them;
  uniform:          both as replica 0 (the control: a router should neither win nor lose);
  drafter_vs_plain: replica 1 without speculation (not run by default: on a 2-core CPU the drafter
                    replica runs at nearly the plain one's speed, so there is little to route around).
Arms (`router:` in the app config): pow2 (Serve's default), round_robin (Serve's), sla (ours). One arm
at a time: the app is deleted and deployed again with that router (each arm starts on fresh replicas,
their SPS tables read from the cache, the replicas' kinds checked against the setting), warmed up, then
runs every load point. The arms take turns in each of --repeats repeats (pow2 first, then last: this
machine's speed drifts within minutes, and a drift must fall on every arm alike), every repeat on the
same schedules, so an arm's repeats are identical work and their spread is the noise band. Every arm
streams the same way (multiplexed over the socket transport, which needs no router's pin), so the arms
differ in routing only.

Load (bench/route_workload.py): seeded open-loop Poisson arrivals for --window-s seconds per point, two
SLA classes (interactive: tight targets, may be refused; batch: loose, never refused), log-normal prompt
and output lengths, greedy decoding to exactly max_tokens. Load points are fractions of the setting's
capacity, measured first (closed loop at every replica's max_num_seqs under pow2, requests finished
per second; a refused request's worker backs off REFUSED_BACKOFF_S before its next), so they reach
overload on any machine. The interactive TPOT target is, unless given, the
median TPOT of that measurement in the heterogeneous setting: between what the fast and the slow
replica deliver at full load, where the choice of replica decides whether it is met. Every arm of a
setting replays the same schedules (the seed fixes them).

    python bench/route.py --models models            # the full run: ~23 minutes on an idle 2-core box
    python bench/route.py --models models --quick    # a smoke run: 1 repeat, 2 short load points

With --calibrate-tpot the SLA router scales each replica's predicted TPOT by its measured decode steps
(router/policy.py PolicyConfig.calibrate_tpot; off by default); every arm's replica report shows the
calibration it would apply (`decode_calibration`) either way. --router-option NAME=VALUE sets any other
PolicyConfig field for the SLA arm (an A/B of a rule: `--arms sla --router-option slot_wait=false`).

Every request is traced (unless --no-trace): every process exports its spans to an OTLP receiver in
this process, in every arm alike. The SLA router's decision event holds its predicted TTFT and TPOT for
each replica; per arm and replica, `predicted_vs_realised` sets them against what the client measured
(bench/route_calibration.py: the median of predicted / realised).

Writes bench/results/route.json (settings, per-arm points, summary with the goodput ratios against
pow2 and the router's decision p99 at 32 replicas from bench/route_decision.py) and route.png
(attainment against load, one line per arm, one panel per setting).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import statistics
import sys
import sysconfig
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from anywhere: deployments/ need not be installed
sys.path.insert(0, str(REPO / "sdk"))

from bench import route_decision  # noqa: E402
from bench.route_calibration import predicted_vs_realised, request_id, traced_requests  # noqa: E402
from bench.route_sim import parse_option  # noqa: E402
from bench.route_workload import (  # noqa: E402
    SETTINGS,
    Arrival,
    Lengths,
    Outcome,
    SlaTarget,
    arm_order,
    engine_kind,
    goodput,
    goodput_interpolated,
    kinds_problem,
    mean_points,
    noise_band,
    paired_ratios,
    schedule,
    score,
    setting_engines,
)

RESULTS = REPO / "bench" / "results"
APP = "route"
ARMS = ("pow2", "round_robin", "sla")
DEFAULT_SETTINGS = ["heterogeneous", "uniform"]
REFUSED_BACKOFF_S = 0.1  # a closed-loop worker refused (429) waits this long: no spinning on a full replica
TEXT_FILES = ("textwrap.py", "bisect.py", "argparse.py", "json/decoder.py")  # prompt text: stdlib source


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", type=Path, default=REPO / "models", help="holds target/ (and drafters/)")
    p.add_argument("--drafter", default="dspark")
    p.add_argument("--num-speculative-tokens", type=int, default=7)
    p.add_argument("--max-num-seqs", type=int, default=8, help="every replica's, but the small one's")
    p.add_argument("--small-max-num-seqs", type=int, default=2, help="replica 1's in heterogeneous")
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    p.add_argument("--settings", nargs="+", default=DEFAULT_SETTINGS, choices=SETTINGS)
    # Where goodput is decided: from comfortable load to overload, two points where every arm crossed 90 %
    # attainment before (between 0.7 and 1.0 x capacity); 12 s windows give ~50-130 requests per point.
    p.add_argument("--load", type=float, nargs="+", default=[0.6, 0.8, 1.0, 1.3], help="x capacity")
    p.add_argument("--window-s", type=float, default=12.0)
    p.add_argument("--warmup-s", type=float, default=2.0)
    p.add_argument("--calibrate-s", type=float, default=6.0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--interactive-share", type=float, default=0.5)
    p.add_argument("--interactive-ttft-ms", type=float, default=1500.0)
    p.add_argument("--interactive-tpot-ms", type=float, default=None, help="default: measured")
    p.add_argument("--batch-ttft-ms", type=float, default=20000.0)
    p.add_argument("--batch-tpot-ms", type=float, default=1000.0)
    p.add_argument("--prompt-median", type=float, default=64)
    p.add_argument("--output-median", type=float, default=32)
    p.add_argument("--length-sigma", type=float, default=0.6)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch threads per replica")
    p.add_argument(
        "--no-trace",
        action="store_true",
        help="no request traces: no predicted-vs-realised calibration (every arm traces alike otherwise)",
    )
    p.add_argument(
        "--calibrate-tpot",
        action="store_true",
        help="the SLA router scales its TPOT by each replica's measured decode steps (router_options)",
    )
    p.add_argument(
        "--router-option",
        type=parse_option,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a PolicyConfig field for the SLA router (a number, true or false), e.g. slot_wait=false",
    )
    p.add_argument("--quick", action="store_true", help="smoke run: 1 repeat, 2 load points, short windows")
    p.add_argument("--out", type=Path, default=RESULTS / "route.json")
    args = p.parse_args(argv)
    args.router_options = dict(args.router_option)
    if args.quick:
        args.repeats, args.load = 1, [0.5, 1.4]
        args.window_s, args.warmup_s, args.calibrate_s = 2.0, 1.0, 3.0
    return args


# ---- the stack ------------------------------------------------------------------------------------


def engines_of(args: argparse.Namespace, setting: str) -> list[dict]:
    """Each replica's engine options (by Serve rank) in `setting`."""
    drafter = {
        "drafter": args.drafter,
        "num_speculative_tokens": args.num_speculative_tokens,
        "scheduler": "fixed",
    }
    return setting_engines(setting, drafter, args.max_num_seqs, args.small_max_num_seqs)


def app_args(
    args: argparse.Namespace, setting: str, arm: str, targets: list[SlaTarget], otlp: str | None = None
) -> dict:
    """The app config of one arm; with `otlp`, every process exports its request spans there (traces
    only, every request, no step events), which is where the router's predictions are read from."""
    telemetry = {
        "otlp_endpoint": otlp,
        "step_sample_rate": 0.0,
        "env": {"OTEL_METRICS_EXPORTER": "none", "OTEL_BSP_SCHEDULE_DELAY": "1000"},
    }
    return {
        "model": str((args.models / "target").resolve()),
        "num_replicas": 2,
        "num_ingress_replicas": 1,  # one router: it sees every request (each ingress runs its own)
        "replica_num_cpus": 0.5,
        "ingress_num_cpus": 0.25,
        "torch_num_threads": args.threads,
        "engine": {"cost_table_profile": "coarse"},
        "engine_by_rank": engines_of(args, setting),
        # Serve's limit is the deployment's, one value for every replica: the biggest replica's slots
        # (as AppConfig defaults it), as a user would set it. Only the SLA router reads each replica's own.
        "max_ongoing_requests": args.max_num_seqs,
        "router": arm,
        # Every arm streams the same lean way: the multiplexed streams over the socket transport (the
        # default) need no router's pin, so they apply with Serve's routers as with ours
        # (AppConfig.stream_mux_applies, checked in `deploy`) and the arms differ in routing only.
        "sla_classes": {
            t.name: {
                "ttft_ms": t.ttft_s * 1e3,
                "tpot_ms": t.tpot_s * 1e3,
                "priority": i,
                "may_shed": t.name == "interactive",
            }
            for i, t in enumerate(targets)
        },
        "default_sla_class": "batch",
        "router_options": {"seed": args.seed, "calibrate_tpot": args.calibrate_tpot, **args.router_options},
        **({"telemetry": telemetry} if otlp else {}),
    }


def start_ray() -> str:
    import ray
    from ray import serve

    from deployments.app import GRPC_SERVICERS

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ray.init(
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": f"{REPO}:{REPO / 'sdk'}"}},
    )
    serve.start(
        http_options={"host": "127.0.0.1", "port": 0},
        grpc_options={"port": port, "grpc_servicer_functions": GRPC_SERVICERS},
    )
    return f"127.0.0.1:{port}"


def deploy(args: dict, setting: str) -> None:
    """Deploy the app afresh and wait until it runs. The old app goes first, so every arm starts on fresh
    replicas: a rolling redeploy would also end on the setting's mix, but only once Serve has made the
    ranks contiguous again and a replica that came up on rank 2 has rebuilt its engine for its new rank
    (deployments/replica_engine.py), after serve.run has returned."""
    from ray import serve

    from deployments.app import build_app
    from deployments.config import AppConfig

    if not AppConfig(**args).stream_mux_applies:  # an arm streaming otherwise would not compare
        raise RuntimeError(f"router {args['router']}: the streams would not be multiplexed")
    if APP in serve.status().applications:
        serve.delete(APP)
    serve.run(build_app(args), name=APP, route_prefix="/")
    kinds = [r["kind"] for r in replica_report({}, replica_stats()).values()]
    problem = kinds_problem(setting, args["engine_by_rank"], kinds)
    if problem:
        raise RuntimeError(problem)


def replica_stats() -> dict[str, dict]:
    from deployments.replicas import routing_stats

    return {s["replica_id"]: s for s in asyncio.run(routing_stats(APP, "TargetReplica"))}


SPEED_SIGNALS = ("recent_tau", "mean_verified", "step_overhead", "recent_round_s", "recent_round_tokens")


def replica_report(before: dict[str, dict], after: dict[str, dict]) -> dict[str, dict]:
    """Per replica over an arm: which kind it is, what it finished, and the speed signals the SLA
    router predicts from (tau, drafts verified per round, step time / forward time, the decode steps'
    measured wall time per round and their decode tokens, and the calibration the router derives from
    them: router/signals.py decode_calibration), to check where the load went and whether the
    predictions could have been right."""
    from router.signals import speed_of

    def calibration(stats: dict) -> float | None:
        speed = speed_of(stats, 0.0)  # the calibration does not depend on the acceptance prior
        return None if speed is None else round(speed.calibration, 3)

    return {
        rid: {
            "kind": engine_kind(bool(s.get("draft_window")), s.get("max_num_seqs", 0)),
            "finished": s.get("finished_requests", 0) - before.get(rid, {}).get("finished_requests", 0),
            **{k: s.get(k) for k in SPEED_SIGNALS},
            "decode_calibration": calibration(s),
        }
        for rid, s in after.items()
    }


# ---- load -----------------------------------------------------------------------------------------


def token_pool(model_dir: Path) -> list[int]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    text = "\n".join((stdlib / name).read_text(encoding="utf-8") for name in TEXT_FILES)
    return tokenizer(text)["input_ids"]


def prompt_of(pool: list[int], arrival: Arrival, index: int) -> list[int]:
    start = (index * 7919) % (len(pool) - arrival.prompt_tokens)  # a fixed window per request
    return pool[start : start + arrival.prompt_tokens]


async def one_request(
    client, pool: list[int], arrival: Arrival, index: int, timeout_s: float, rid: str | None = None
) -> Outcome:
    from dspark_client import DSparkClientError, ResourceExhaustedError

    sent = time.perf_counter()
    first = last = None
    tokens = 0
    try:
        stream = client.stream(
            prompt_token_ids=prompt_of(pool, arrival, index),
            max_tokens=arrival.max_tokens,
            temperature=0.0,
            ignore_eos=True,
            sla_class=arrival.sla_class,
            timeout=timeout_s,
            request_id=rid,
        )
        async with stream:
            async for delta in stream:
                if delta.token_ids:
                    last = time.perf_counter()
                    first = first or last
                    tokens += len(delta.token_ids)
    except ResourceExhaustedError:
        return Outcome(arrival, "refused")
    except (DSparkClientError, asyncio.TimeoutError):
        return Outcome(arrival, "error", tokens=tokens)
    if first is None:
        return Outcome(arrival, "error")
    tpot = (last - first) / (tokens - 1) if tokens > 1 else None
    return Outcome(arrival, "ok", first - sent, tpot, tokens)


async def open_loop(
    target: str, pool: list[int], arrivals: list[Arrival], timeout_s: float, tag: str | None = None
) -> list[Outcome]:
    """Each request starts at its arrival time, whatever is still running (open loop); with `tag`, the
    i-th goes with request id request_id(tag, i), by which its trace is found."""
    from dspark_client import NO_RETRY, AsyncClient

    async with AsyncClient(target, application=APP, retry=NO_RETRY) as client:
        start = time.perf_counter()

        async def at(index: int, arrival: Arrival) -> Outcome:
            await asyncio.sleep(max(0.0, start + arrival.at_s - time.perf_counter()))
            rid = request_id(tag, index) if tag is not None else None
            return await one_request(client, pool, arrival, index, timeout_s, rid)

        return list(await asyncio.gather(*(at(i, a) for i, a in enumerate(arrivals))))


async def closed_loop(
    target: str, pool: list[int], arrivals: list[Arrival], concurrency: int, seconds: float
) -> tuple[float, list[Outcome]]:
    """Requests finished per second with `concurrency` always in flight, and their outcomes."""
    from dspark_client import NO_RETRY, AsyncClient

    outcomes: list[Outcome] = []
    async with AsyncClient(target, application=APP, retry=NO_RETRY) as client:
        start = time.perf_counter()
        queue = iter(enumerate(arrivals))

        async def worker() -> None:
            for index, arrival in queue:
                if time.perf_counter() - start >= seconds:
                    return
                outcomes.append(await one_request(client, pool, arrival, index, 120.0))
                if outcomes[-1].status == "refused":
                    await asyncio.sleep(REFUSED_BACKOFF_S)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - start
    return sum(o.status == "ok" for o in outcomes) / elapsed, outcomes


# ---- the run --------------------------------------------------------------------------------------


def traces_of(receiver, sent: list[tuple[str, Outcome]], bound_s: float = 15.0) -> dict:
    """The traces of the completed requests in `sent`, once all have arrived or `bound_s` passed
    (the processes export spans in batches, every second)."""
    wanted = {rid for rid, o in sent if o.status == "ok"}
    deadline = time.monotonic() + bound_s
    while True:
        traced = traced_requests(receiver.spans())
        if wanted <= traced.keys() or time.monotonic() > deadline:
            return traced
        time.sleep(0.5)


def run_setting(
    args, setting: str, target: str, pool: list[int], targets: list[SlaTarget], log, receiver=None
) -> dict:
    prompt = Lengths(args.prompt_median, args.length_sigma, 4, 4 * int(args.prompt_median))
    output = Lengths(args.output_median, args.length_sigma, 2, 4 * int(args.output_median))
    # Capacity, under Serve's default router (the arms' loads are fractions of it); the pow2 arm then
    # runs on this deployment (it reads no SLA targets, so measuring them later changes nothing there).
    otlp = receiver.endpoint if receiver is not None else None
    deploy(app_args(args, setting, "pow2", targets, otlp), setting)
    calibration = schedule(1.0, 4000.0, targets, prompt, output, args.seed)  # only the requests count
    concurrency = sum(e["max_num_seqs"] for e in engines_of(args, setting))  # every replica's slots
    asyncio.run(closed_loop(target, pool, calibration, concurrency, 1.0))  # warm: first calls, tables
    capacity, outcomes = asyncio.run(closed_loop(target, pool, calibration, concurrency, args.calibrate_s))
    tpots = [o.tpot_s for o in outcomes if o.tpot_s is not None]
    median_tpot = statistics.median(tpots) if tpots else None
    rates = [round(capacity * x, 3) for x in args.load]
    log(f"{setting}: capacity {capacity:.2f} req/s, median TPOT at it {median_tpot}, rates {rates}")
    if args.interactive_tpot_ms is None and setting == args.settings[0] and median_tpot:
        targets[0] = SlaTarget("interactive", targets[0].share, targets[0].ttft_s, median_tpot)
        log(f"interactive TPOT target: {median_tpot * 1e3:.1f} ms (measured)")
    result: dict = {
        "capacity_rps": round(capacity, 3),
        "median_tpot_ms_at_capacity": median_tpot and round(median_tpot * 1e3, 2),
        "rates_rps": rates,
        "arms": {},
    }
    # Interleaved repeats: in each repeat every arm runs every load point in turn (arm_order), each on the
    # same schedules in every repeat (identical work, so repeats of an arm measure the noise band).
    arrivals_at = [
        schedule(rate, args.window_s, targets, prompt, output, args.seed * 1000 + 10 * k)
        for k, rate in enumerate(rates)
    ]
    warm = schedule(rates[0], args.warmup_s, targets, prompt, output, args.seed + 999)
    repeats: dict[str, list[list[dict]]] = {arm: [] for arm in args.arms}
    reports: dict[str, list[dict]] = {arm: [] for arm in args.arms}
    sent: dict[str, list[tuple[str, Outcome]]] = {arm: [] for arm in args.arms}  # (request id, outcome)
    kinds: dict[str, str] = {}  # replica id -> kind, over every arm's replicas
    deployed = "pow2"
    for r in range(args.repeats):
        for arm in arm_order(args.arms, r):
            if arm != deployed:
                deploy(app_args(args, setting, arm, targets, otlp), setting)
                deployed = arm
                # Fresh replicas: warm them as the calibration warmed pow2's (first calls at full batch).
                asyncio.run(closed_loop(target, pool, calibration, concurrency, 1.0))
            asyncio.run(open_loop(target, pool, warm, timeout_s=60.0))
            before = replica_stats()
            points = []
            for k, rate in enumerate(rates):
                tag = f"{setting}.{arm}.r{r}.p{k}"
                outcomes = asyncio.run(
                    open_loop(target, pool, arrivals_at[k], 60.0, tag if receiver is not None else None)
                )
                sent[arm].extend((request_id(tag, i), o) for i, o in enumerate(outcomes))
                points.append(
                    {"rate_rps": rate, "load": args.load[k], **score(outcomes, targets, args.window_s)}
                )
                log(f"{setting} repeat {r} {arm} rate {rate}: {points[-1]}")
            repeats[arm].append(points)
            reports[arm].append(replica_report(before, replica_stats()))
            kinds.update({rid: report["kind"] for rid, report in reports[arm][-1].items()})
    traced = traces_of(receiver, [x for arm in args.arms for x in sent[arm]]) if receiver else None
    for arm in args.arms:
        points = mean_points(repeats[arm])
        result["arms"][arm] = {
            "points": points,
            "goodput_rps": goodput(points),
            "goodput_rps_by_repeat": [goodput(p) for p in repeats[arm]],
            "goodput_rps_interpolated": goodput_interpolated(points),
            "goodput_rps_interpolated_by_repeat": [goodput_interpolated(p) for p in repeats[arm]],
            "noise_band_met_rps": noise_band(repeats[arm]),
            "replicas_by_repeat": reports[arm],
            # Per replica over every repeat and load point: predicted (at decision time, SLA router
            # only) against realised (the client's) TTFT and TPOT, the median of their ratio.
            "predicted_vs_realised": None
            if traced is None
            else predicted_vs_realised(sent[arm], traced, kinds, targets),
        }
    return result


def summary(settings: dict, decision: dict) -> dict:
    def ratio(setting: str, field: str = "goodput_rps") -> float | None:
        arms = settings.get(setting, {}).get("arms", {})
        if "sla" not in arms or "pow2" not in arms:
            return None
        base = arms["pow2"][field]
        return round(arms["sla"][field] / base, 3) if base > 0 else None

    def paired(setting: str, field: str = "goodput_rps_by_repeat") -> list[float | None] | None:
        arms = settings[setting]["arms"]
        if not {"sla", "pow2"} <= set(arms):
            return None
        return paired_ratios(arms["sla"][field], arms["pow2"][field])

    def band(setting: str) -> float | None:
        bands = [a["noise_band_met_rps"] for a in settings[setting]["arms"].values()]
        return max((b for b in bands if b is not None), default=None)

    return {
        "goodput_ratio_vs_pow2_heterogeneous": ratio("heterogeneous"),
        "goodput_ratio_vs_pow2_uniform": ratio("uniform"),
        "goodput_ratio_vs_pow2_drafter_vs_plain": ratio("drafter_vs_plain"),
        # The same, with each arm's goodput interpolated where attainment crosses 90% (less noisy).
        "goodput_ratio_vs_pow2_heterogeneous_interpolated": ratio(
            "heterogeneous", "goodput_rps_interpolated"
        ),
        "goodput_ratio_vs_pow2_uniform_interpolated": ratio("uniform", "goodput_rps_interpolated"),
        # Repeat by repeat (sla and pow2 ran in turn on the same schedules), and how far identical repeats
        # of any one arm fell apart (met requests/s at any load point): a ratio inside it is not shown.
        "paired_ratio_vs_pow2_by_repeat": {s: paired(s) for s in settings},
        "paired_ratio_vs_pow2_by_repeat_interpolated": {
            s: paired(s, "goodput_rps_interpolated_by_repeat") for s in settings
        },
        "noise_band_met_rps": {s: band(s) for s in settings},
        "decision_p99_ms_32_replicas": decision["cases"]["periodic"]["32"]["p99_ms"],
        "decision_cpu_p99_ms_32_replicas": decision["cases"]["periodic"]["32"]["cpu_p99_ms"],
        "targets": {
            "goodput_ratio_vs_pow2_heterogeneous": ">= 1.2",
            "goodput_ratio_vs_pow2_uniform": "within 0.97..1.03",
            "decision_p99_ms_32_replicas": "<= 2",
        },
    }


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measured = result["settings"]["measured"]
    fig, axes = plt.subplots(1, len(measured), figsize=(5.5 * len(measured), 4), squeeze=False)
    for ax, (name, setting) in zip(axes[0], measured.items()):
        for arm, by_setting in result["arms"].items():
            points = by_setting[name]["points"]
            xs = [p["rate_rps"] for p in points]
            ax.plot(xs, [p["attainment"] for p in points], marker="o", label=arm)
        ax.axhline(0.9, color="grey", linestyle=":", linewidth=1)
        ax.set(title=f"{name} (capacity {setting['capacity_rps']} req/s)", xlabel="offered load (req/s)")
        ax.set(ylabel="SLA attainment", ylim=(0, 1.05))
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    torch.set_num_threads(1)
    began = time.perf_counter()

    def log(message: str) -> None:
        print(f"[{time.perf_counter() - began:6.1f}s] {message}", flush=True)

    targets = [
        # Until measured (run_setting), a target nothing misses.
        SlaTarget(
            "interactive",
            args.interactive_share,
            args.interactive_ttft_ms / 1e3,
            (args.interactive_tpot_ms or 60_000.0) / 1e3,
        ),
        SlaTarget("batch", 1 - args.interactive_share, args.batch_ttft_ms / 1e3, args.batch_tpot_ms / 1e3),
    ]
    pool = token_pool(args.models / "target")
    decision = route_decision.run(
        replicas=(1, 8, 32, 128), decisions=300 if args.quick else 2000, seed=args.seed
    )
    log(f"decision p99 at 32 replicas: {decision['p99_ms_32_replicas']} ms")
    receiver = None
    if not args.no_trace:
        from dspark.telemetry.receiver import OTLPReceiver

        receiver = OTLPReceiver()  # the request spans of every process: the router's predictions
    target = start_ray()
    settings: dict = {}
    try:
        for setting in args.settings:
            settings[setting] = run_setting(args, setting, target, pool, targets, log, receiver)
    finally:
        if receiver is not None:
            receiver.close()
        import ray
        from ray import serve

        serve.shutdown()
        ray.shutdown()
    result = {
        "command": "python bench/route.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "load_avg_1m_at_end": round(os.getloadavg()[0], 2),  # other work skews every arm
            "wall_s": round(time.perf_counter() - began, 1),
        },
        "settings": {
            "replicas": 2,
            "streams": "multiplexed over the socket transport, every arm",
            "traced": "every request, every arm (spans to an OTLP receiver here)" if receiver else "no",
            "engines_by_rank": {s: engines_of(args, s) for s in args.settings},
            "max_ongoing_requests": args.max_num_seqs,
            "sla_router_calibrates_tpot": args.calibrate_tpot,
            "sla_router_options": args.router_options,
            "load_x_capacity": args.load,
            "window_s": args.window_s,
            "warmup_s": args.warmup_s,
            "repeats": args.repeats,
            "classes": {
                t.name: {"share": t.share, "ttft_ms": t.ttft_s * 1e3, "tpot_ms": round(t.tpot_s * 1e3, 2)}
                for t in targets
            },
            "prompt_tokens": {"median": args.prompt_median, "sigma": args.length_sigma},
            "output_tokens": {"median": args.output_median, "sigma": args.length_sigma},
            "seed": args.seed,
            "quick": args.quick,
            "measured": {s: {k: v for k, v in settings[s].items() if k != "arms"} for s in settings},
        },
        "arms": {arm: {s: settings[s]["arms"][arm] for s in settings} for arm in args.arms},
        "decision": decision,
    }
    result["summary"] = summary(settings, decision)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    plot(result, args.out.with_suffix(".png"))
    log(f"summary: {json.dumps(result['summary'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
