"""The cluster controller on a load ramp: light -> heavy -> light, open loop, mixed SLA classes.

Three arms serve the same seeded schedule through real Ray Serve (gRPC, `dspark_client`): a fixed
block of 7 (every round verifies 7 drafts), the engine alone (Algorithm 1 and its draft gate), and the
engine under the cluster controller; the engine alone runs a second time, last, for the noise band.
Per phase and arm: throughput, tok/s per user, SLA attainment
per class (TTFT and TPOT both within the class's targets); for the controller, the budget it set over
time and how many periods it took to settle after each step of the ramp.

    python bench/control.py --model models/target --drafter dspark      # 3 repeats, 30 s phases
    python bench/control.py --model DIR --drafter ngram --quick      # a smoke run of the plumbing

Writes bench/results/control.json and control.md, and control.png (budget and throughput over time).
Speculation barely pays on two CPU cores: on such a machine the arms differ little, and the GPU-scale
picture is the simulator's.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import socket
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from anywhere
RESULTS = REPO / "bench" / "results"
ADMIN_TOKEN = "bench"
NOISE_ARM = "engine_only_repeat"
# SLA classes: interactive users want tokens fast; batch jobs only want them eventually.
CLASSES = {
    "interactive": {"ttft_s": 2.0, "tpot_s": 0.25, "share": 0.3},
    "batch": {"ttft_s": 30.0, "tpot_s": 2.0},
}


@dataclass
class Outcome:
    phase: int
    sla_class: str
    start: float  # seconds since the arm began
    ttft: float
    seconds: float
    tokens: int
    error: str | None = None

    @property
    def tpot(self) -> float:
        return (self.seconds - self.ttft) / max(1, self.tokens - 1)

    def met(self) -> bool:
        target = CLASSES[self.sla_class]
        return self.error is None and self.ttft <= target["ttft_s"] and self.tpot <= target["tpot_s"]


def schedule(phases: list[tuple[str, float, float]], seed: int) -> list[tuple[float, int, str]]:
    """Seeded Poisson arrivals: (time, phase index, SLA class) for phases of (name, rate/s, seconds)."""
    rng, out, start = random.Random(seed), [], 0.0
    for index, (_, rate, duration) in enumerate(phases):
        t = start + rng.expovariate(rate)
        while t < start + duration:
            cls = "interactive" if rng.random() < CLASSES["interactive"]["share"] else "batch"
            out.append((t, index, cls))
            t += rng.expovariate(rate)
        start += duration
    return out


def run_arm(target: str, app: str, arrivals, prompts: list[str], max_tokens: int) -> list[Outcome]:
    import dspark_client

    client = dspark_client.Client(target, application=app, retry=dspark_client.NO_RETRY, timeout_s=300)
    t0 = time.perf_counter()

    def one(i: int, at: float, phase: int, cls: str) -> Outcome:
        time.sleep(max(0.0, at - (time.perf_counter() - t0)))  # open loop: start on schedule
        start = time.perf_counter()
        first, tokens = None, 0
        try:
            prompt = prompts[i % len(prompts)]
            with client.stream(
                prompt, max_tokens=max_tokens, temperature=0.0, ignore_eos=True, sla_class=cls
            ) as s:
                for _ in s:
                    first = first or time.perf_counter()
            tokens = s.completion.usage.completion_tokens
        except Exception as exc:  # a refusal (429) or an error counts as a missed SLA
            return Outcome(phase, cls, start - t0, 0.0, time.perf_counter() - start, 0, repr(exc))
        end = time.perf_counter()
        return Outcome(phase, cls, start - t0, (first or end) - start, end - start, tokens)

    try:
        with ThreadPoolExecutor(max(8, len(arrivals))) as pool:
            return list(pool.map(lambda a: one(a[0], *a[1]), enumerate(arrivals)))
    finally:
        client.close()


def phase_summary(outcomes: list[Outcome], phases, index: int) -> dict:
    mine = [o for o in outcomes if o.phase == index]
    done = [o for o in mine if o.error is None]
    duration = phases[index][2]
    return {
        "phase": phases[index][0],
        "requests": len(mine),
        "errors": len(mine) - len(done),
        "throughput_tok_s": sum(o.tokens for o in done) / duration,
        "tok_s_user": statistics.mean(o.tokens / o.seconds for o in done) if done else 0.0,
        "attainment": {
            c: (
                sum(o.met() for o in mine if o.sla_class == c) / n
                if (n := sum(o.sla_class == c for o in mine))
                else None
            )
            for c in CLASSES
        },
    }


def budget_trace(http_url: str, app: str, stop: threading.Event, out: list) -> None:
    """Poll the controller's state once a second while the arm runs: time, period, and per replica the
    caps in force and the load it reported."""
    t0 = time.perf_counter()
    while not stop.wait(1.0):
        request = urllib.request.Request(
            f"{http_url}/{app}/admin/controller/state", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
        )
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                state = json.loads(response.read())
        except Exception:
            continue
        caps = {rid: r["caps"] for rid, r in state["replicas"].items()}
        # The load each replica reported: open-loop arrivals build it up over several periods after a step.
        load = {
            rid: r["telemetry"]["running"] + r["telemetry"]["queued"] for rid, r in state["replicas"].items()
        }
        received = (state.get("otlp") or {}).get("received")  # spans and points so far
        out.append(
            {
                "t": round(time.perf_counter() - t0, 2),
                "period": state["period"],
                "caps": caps,
                "load": load,
                "otlp_received": received,
            }
        )


def settle_periods(trace: list[dict], phases) -> list[int | None]:
    """Per step of the ramp, the controller's periods from the step until its caps last changed before
    the next step (from then on they hold what the phase ends with).

    Counted as the policy's tests count (tests/controller/test_policy.py `settle_period`): 1 when the
    first decision after the step made the last change, 0 when nothing changed. The base is the period
    of the last poll before the step, so a change made between the step and the next poll counts; a
    decision between that poll and the step counts as after it (polls are 1 s apart: the measure errs
    long by at most one period, never short).
    """
    out, start = [], 0.0
    for (_, _, duration), (_, _, following) in zip(phases, phases[1:]):
        start += duration
        before = [p for p in trace if p["t"] < start and p["caps"]]
        after = [p for p in trace if start <= p["t"] < start + following]
        if not before or not after:
            out.append(None)
            continue
        polls = [before[-1], *after]
        changes = [i for i in range(1, len(polls)) if polls[i]["caps"] != polls[i - 1]["caps"]]
        out.append(polls[changes[-1]]["period"] - before[-1]["period"] if changes else 0)
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="models/target")
    parser.add_argument("--drafter", default="dspark")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--rates", type=float, nargs=3, default=[0.5, 6.0, 0.5], help="requests/s per phase")
    # 3 phases x 30 s x 3 repeats x 3 arms, plus each arm's start: about 16 minutes on 2 idle cores.
    parser.add_argument("--phase-seconds", type=float, default=30.0)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--period", type=float, default=2.0, help="the controller's period, seconds")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="smoke run: short phases, one repeat")
    parser.add_argument("--out", type=Path, default=None, help="default: bench/results/control.json")
    args = parser.parse_args(argv)
    if args.quick:  # never over the real results
        args.rates, args.phase_seconds, args.max_tokens, args.repeats = [0.5, 2.0, 0.5], 6.0, 12, 1
        args.replicas = 1
        args.out = args.out or Path(tempfile.gettempdir()) / "control_quick.json"
    args.out = args.out or RESULTS / "control.json"

    import ray
    from ray import serve

    from deployments.app import GRPC_SERVICERS, build_app

    phases = [(name, rate, args.phase_seconds) for name, rate in zip(("light", "heavy", "light"), args.rates)]
    model = str(Path(args.model).resolve())
    prompts = [f"def f{i}(x):\n    return" for i in range(16)]
    sla = {"interactive": {"tpot_s": CLASSES["interactive"]["tpot_s"], "interactive": True}}
    arms = {
        "fixed_block_7": ({"scheduler": "fixed", "num_speculative_tokens": 7}, None),
        "engine_only": ({"scheduler": "dspark", "num_speculative_tokens": 7}, None),
        "engine_controller": (
            {"scheduler": "dspark", "num_speculative_tokens": 7},
            {
                "period_s": args.period,
                "admin_tokens": [ADMIN_TOKEN],
                "policy": {"sla_classes": sla},
                # The replicas export their spans and metrics to the controller's OTLP receiver (its
                # TTFT/TPOT per class, calibration error and forward slowdown come from there): the
                # arm pays the export, as a deployment with the controller does.
                "otlp_port": _free_port(),
            },
        ),
        # The engine-only arm again, last: the distance between identical runs is the noise band.
        NOISE_ARM: ({"scheduler": "dspark", "num_speculative_tokens": 7}, None),
    }
    http_port, grpc_port = _free_port(), _free_port()
    ray.init(
        address="local",  # a cluster of our own, never one another process started on this machine
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}},
    )
    serve.start(
        http_options={"host": "127.0.0.1", "port": http_port},
        grpc_options={"port": grpc_port, "grpc_servicer_functions": GRPC_SERVICERS},
    )
    http_url, target = f"http://127.0.0.1:{http_port}", f"127.0.0.1:{grpc_port}"
    results: dict = {"arms": {}, "traces": {}}
    began = time.perf_counter()
    try:
        # Each arm's app starts once (model load, cost-table profiling) and serves every repeat of the
        # schedule; the ramp ends light, so the controller arm starts each repeat from light-load caps.
        for name, (engine, controller) in arms.items():
            app_args = {
                "model": model,
                "engine": {"drafter": args.drafter, **engine},
                "num_replicas": args.replicas,
                "num_ingress_replicas": 1,
                "torch_num_threads": 1,
                # Two replicas and their ingress share this machine's cores (Ray counts 1 CPU per
                # replica by default: the ingress would never be scheduled on two cores).
                "replica_num_cpus": 0.5,
                "ingress_num_cpus": 0.25,
                "controller": controller,
            }
            serve.run(build_app(app_args), name=name, route_prefix=f"/{name}")
            try:
                for repeat in range(args.repeats):
                    arrivals = schedule(phases, args.seed + repeat)
                    stop, trace = threading.Event(), []
                    poller = threading.Thread(target=budget_trace, args=(http_url, name, stop, trace))
                    if controller is not None:
                        poller.start()
                    try:
                        outcomes = run_arm(target, name, arrivals, prompts, args.max_tokens)
                    finally:
                        stop.set()
                        if poller.is_alive():
                            poller.join()
                    summary = [phase_summary(outcomes, phases, i) for i in range(len(phases))]
                    results["arms"].setdefault(name, []).append(summary)
                    if controller is not None:
                        results["traces"].setdefault(name, []).append(
                            {"trace": trace, "settle_periods": settle_periods(trace, phases)}
                        )
                    print(
                        f"[{time.perf_counter() - began:6.0f}s] {name} repeat {repeat + 1}/{args.repeats}",
                        file=sys.stderr,
                        flush=True,
                    )
            finally:
                serve.delete(name)
    finally:
        serve.shutdown()
        ray.shutdown()
    results["wall_s"] = time.perf_counter() - began

    report = summarize(results, phases, args, argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(
        f"# Controller on a load ramp\n\n`{report['command']}`\n\n" + table(report)
    )
    plot(report, args.out.with_suffix(".png"))
    print(table(report))
    return 0


def summarize(results: dict, phases, args, argv) -> dict:
    """Mean over repeats per arm and phase; the summary against the best static arm in every phase."""
    arms = {}
    for name, runs in results["arms"].items():
        arms[name] = [
            {
                "phase": phases[i][0],
                "throughput_tok_s": statistics.mean(r[i]["throughput_tok_s"] for r in runs),
                "tok_s_user": statistics.mean(r[i]["tok_s_user"] for r in runs),
                "errors": sum(r[i]["errors"] for r in runs),
                "attainment": {
                    c: _mean([r[i]["attainment"][c] for r in runs if r[i]["attainment"][c] is not None])
                    for c in CLASSES
                },
            }
            for i in range(len(phases))
        ]
    static = [a for a in arms if a not in ("engine_controller", NOISE_ARM)]
    ratios, deltas = [], []
    for i in range(len(phases)):
        best = max(static, key=lambda a: arms[a][i]["throughput_tok_s"])
        ours = arms["engine_controller"][i]
        ratios.append(ours["throughput_tok_s"] / max(1e-9, arms[best][i]["throughput_tok_s"]))
        for c in CLASSES:
            if ours["attainment"][c] is not None and arms[best][i]["attainment"][c] is not None:
                deltas.append(ours["attainment"][c] - arms[best][i]["attainment"][c])
    settles = [s for t in results["traces"].get("engine_controller", []) for s in t["settle_periods"]]
    return {
        "command": "python bench/control.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "load_avg_1m": os.getloadavg()[0],
        },
        "config": {
            "drafter": args.drafter,
            "replicas": args.replicas,
            "max_tokens": args.max_tokens,
            "period_s": args.period,
            "repeats": args.repeats,
            "seed": args.seed,
            "classes": CLASSES,
        },
        "phases": [{"name": n, "rate_rps": r, "seconds": s} for n, r, s in phases],
        "wall_s": round(results.get("wall_s", 0.0), 1),
        "arms": arms,
        "traces": results["traces"],
        "summary": {
            "min_phase_throughput_ratio_vs_best_static": min(ratios),
            "min_phase_attainment_delta_vs_best_static": min(deltas) if deltas else None,
            "settle_periods_max": max((s for s in settles if s is not None), default=None),
            "controller_cap_changes": cap_changes(results["traces"].get("engine_controller", [])),
            # What the controller's OTLP receiver had taken in by the last poll (cumulative over repeats).
            "controller_otlp_received": next(
                (
                    p["otlp_received"]
                    for run in reversed(results["traces"].get("engine_controller", []))
                    for p in reversed(run["trace"])
                    if p.get("otlp_received")
                ),
                None,
            ),
            **noise_band(arms),
        },
    }


def cap_changes(traces: list[dict]) -> int:
    """How many times, over every repeat, the caps the controller held changed from one poll to the next:
    0 means it kept the engine's defaults, so its arm differs from the engine alone only by noise and by
    the controller's own cost."""
    changes = 0
    for run in traces:
        # A poll before the controller's first period reads no caps at all: not a move.
        caps = [json.dumps(p["caps"], sort_keys=True) for p in run["trace"] if p["caps"]]
        changes += sum(a != b for a, b in zip(caps, caps[1:]))
    return changes


def noise_band(arms: dict) -> dict:
    """The largest distance, over phases, between the two identical engine-only arms."""
    if NOISE_ARM not in arms or "engine_only" not in arms:
        return {}
    throughput, attainment = [], []
    for a, b in zip(arms["engine_only"], arms[NOISE_ARM]):
        throughput.append(abs(b["throughput_tok_s"] / max(1e-9, a["throughput_tok_s"]) - 1))
        for c in CLASSES:
            if a["attainment"][c] is not None and b["attainment"][c] is not None:
                attainment.append(abs(b["attainment"][c] - a["attainment"][c]))
    return {
        "noise_band_throughput": max(throughput),
        "noise_band_attainment": max(attainment, default=None),
    }


def _mean(values: list[float]) -> float | None:
    return statistics.mean(values) if values else None


def table(report: dict) -> str:
    lines = [
        "| phase | arm | throughput tok/s | tok/s/user | interactive SLA | batch SLA | errors |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for i, phase in enumerate(report["phases"]):
        for arm, rows in report["arms"].items():
            row = rows[i]
            att = {c: "-" if v is None else f"{v:.0%}" for c, v in row["attainment"].items()}
            lines.append(
                f"| {phase['name']} | {arm} | {row['throughput_tok_s']:.1f} | {row['tok_s_user']:.1f} | "
                f"{att['interactive']} | {att['batch']} | {row['errors']} |"
            )
    return "\n".join(lines) + "\n\n" + json.dumps(report["summary"]) + "\n"


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=False)
    for run in report["traces"].get("engine_controller", [])[:1]:
        for rid in sorted({r for p in run["trace"] for r in p["caps"]}):
            points = [(p["t"], p["caps"][rid]) for p in run["trace"] if rid in p["caps"]]
            steps = [(t, -1 if not c["drafting"] else c["max_step_tokens"] or 0) for t, c in points]
            top.step([t for t, _ in steps], [v for _, v in steps], where="post", label=f"replica {rid}")
    top.set_ylabel("step cap (0: none, -1: off)")
    top.legend(loc="best", fontsize="small")
    names = [p["name"] for p in report["phases"]]
    for arm, rows in report["arms"].items():
        bottom.plot(range(len(rows)), [r["throughput_tok_s"] for r in rows], marker="o", label=arm)
    bottom.set_xticks(range(len(names)), names)
    bottom.set_ylabel("throughput (tok/s)")
    bottom.legend(loc="best", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    sys.exit(main())
