"""How this machine's scheduler shares its cores between engines that step and a bursty serving path.

The simulator's host model (sim/host.py) needs one law: how much longer than alone an engine's step runs
when other engines step and the serving path (proxy, ingress, Ray, the replicas' serving threads) keeps
some cores busy in short bursts. Two laws are on the table:

- fluid (max-min fair): the path's bursts go to whichever core is free, the engines stepping share what
  is left: a step alone on a two-core host runs at full speed, two at once at 2 / (2 - load) each;
- per core: each engine stepping holds a core and the path's load lands evenly on every core, so a step
  runs cores / (cores - load) times longer whether or not the other engines step (and, with more engines
  stepping than cores, they share what is left).

Measured here with stand-ins whose CPU is exactly known (no model, no Ray): two "engine" processes that
spin for `step` CPU seconds per step, back to back in busy periods with idle gaps between (a stepping
share like a served replica's), and five "path" processes that spin `burst` CPU seconds at exponential
intervals (the serving path's load). Each engine's stretch is its steps' wall over their CPU; the laws'
predictions use the run's own measured path load and how much the two engines' steps overlapped. The
stretch of the steps that ran alone and of those that ran beside the other engine is reported apart.

    python bench/host_sharing.py   # about 1.5 minutes; writes bench/results/host_sharing.{json,md}

Run it on an otherwise idle machine: other work is load neither law is told about.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from anywhere

from sim.host import stretch  # noqa: E402

RESULTS = REPO / "bench" / "results"
PATH_PROCESSES = 5


@dataclass(frozen=True)
class Regime:
    name: str
    step_s: float  # an engine's CPU per step
    gap_s: float  # mean idle time per step (a gap follows a step with probability GAP_CHANCE)
    path_cores: float  # the path's load it aims at (what it achieves is measured)
    burst_s: float  # the path's CPU per burst


GAP_CHANCE = 0.3
REGIMES = (
    Regime("light", 0.007, 0.006, 0.35, 0.0005),
    Regime("validation-like", 0.007, 0.003, 0.75, 0.0005),
    Regime("busy", 0.010, 0.002, 0.9, 0.001),
)

Step = tuple[float, float, float]  # (start, end) on the monotonic clock, CPU seconds


def _spin(cpu_s: float) -> None:
    start = time.thread_time()
    while time.thread_time() - start < cpu_s:
        pass


def _engine(seed: int, regime: Regime, seconds: float, out: mp.Queue) -> None:
    rng, end, steps = random.Random(seed), time.monotonic() + seconds, []
    while time.monotonic() < end:
        if rng.random() < GAP_CHANCE:
            time.sleep(rng.expovariate(GAP_CHANCE / regime.gap_s))
        wall, cpu = time.monotonic(), time.thread_time()
        _spin(regime.step_s)
        steps.append((wall, time.monotonic(), time.thread_time() - cpu))
    out.put(("engine", seed, steps))


def _path(seed: int, regime: Regime, seconds: float, out: mp.Queue) -> None:
    rng, end, cpu = random.Random(seed), time.monotonic() + seconds, 0.0
    rate = regime.path_cores / PATH_PROCESSES / regime.burst_s  # bursts per second, this process
    while time.monotonic() < end:
        time.sleep(rng.expovariate(rate))
        start = time.thread_time()
        _spin(regime.burst_s)
        cpu += time.thread_time() - start
    out.put(("path", seed, cpu))


def overlap(step: Step, other: list[Step], start: int = 0) -> tuple[float, int]:
    """Seconds of `step` during which one of `other` (sorted, disjoint) ran, and where to search next."""
    a, b, _ = step
    while start < len(other) and other[start][1] < a:
        start += 1
    seconds, k = 0.0, start
    while k < len(other) and other[k][0] < b:
        seconds += max(0.0, min(b, other[k][1]) - max(a, other[k][0]))
        k += 1
    return seconds, start


def engine_report(steps: list[Step], other: list[Step], load: float, cores: int, seconds: float) -> dict:
    """One engine's measured stretch beside the two laws' at the run's load and the steps' overlap."""
    wall = cpu = beside = 0.0
    split = {"alone": [0.0, 0.0], "beside": [0.0, 0.0]}  # wall, CPU of steps (almost) alone / beside
    j = 0
    for step in steps:
        seconds_beside, j = overlap(step, other, j)
        length = step[1] - step[0]
        wall, cpu, beside = wall + length, cpu + step[2], beside + seconds_beside
        share = seconds_beside / length if length > 0 else 0.0
        kind = "alone" if share < 0.05 else "beside" if share > 0.95 else None
        if kind:
            split[kind][0] += length
            split[kind][1] += step[2]
    s = beside / wall
    laws = {
        law: round(
            s * stretch(load, cores, 2, PATH_PROCESSES, law)
            + (1 - s) * stretch(load, cores, 1, PATH_PROCESSES, law),
            3,
        )
        for law in ("fluid", "per_core")
    }
    return {
        "steps": len(steps),
        "stepping_share": round(wall / seconds, 3),
        "beside_other_share": round(s, 3),
        "measured": round(wall / cpu, 3),
        **laws,
        "measured_alone": round(split["alone"][0] / split["alone"][1], 3) if split["alone"][1] else None,
        "measured_beside": round(split["beside"][0] / split["beside"][1], 3) if split["beside"][1] else None,
        "law_alone": {
            law: round(stretch(load, cores, 1, PATH_PROCESSES, law), 3) for law in ("fluid", "per_core")
        },
        "law_beside": round(stretch(load, cores, 2, PATH_PROCESSES, "fluid"), 3),
    }


def run(regime: Regime, seconds: float) -> dict:
    out: mp.Queue = mp.Queue()
    procs = [mp.Process(target=_engine, args=(i, regime, seconds, out)) for i in range(2)]
    procs += [mp.Process(target=_path, args=(100 + i, regime, seconds, out)) for i in range(PATH_PROCESSES)]
    for p in procs:
        p.start()
    results = [out.get() for _ in procs]
    for p in procs:
        p.join()
    engines = {seed: steps for kind, seed, steps in results if kind == "engine"}
    load = sum(cpu for kind, _, cpu in results if kind == "path") / seconds
    cores = os.cpu_count() or 1
    return {
        "regime": asdict(regime),
        "path_cores": round(load, 3),
        "engines": [engine_report(engines[i], engines[1 - i], load, cores, seconds) for i in (0, 1)],
    }


def markdown(result: dict) -> str:
    lines = [
        "# Host sharing: how this machine's scheduler stretches an engine's steps",
        "",
        f"`{result['command']}` (started {result.get('measured_at', 'at an unrecorded time')}) — "
        f"{result['cores']} cores, {result['seconds']:.0f} s per regime, "
        f"1-min load {result['load_avg_1m_at_start']:.2f} at start.",
        "",
        "Two stand-in engines spin a known CPU per step (idle gaps between busy periods), five stand-in path "
        "processes spin short bursts. Stretch = the steps' wall over their CPU; the laws (sim/host.py) at "
        "the run's measured path load and the engines' measured overlap.",
        "",
        "| regime | engine | path cores | stepping | beside other | measured | fluid | per core "
        "| alone: measured / fluid / per core | beside: measured / law |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in result["regimes"]:
        for i, e in enumerate(r["engines"]):
            alone = f"{e['measured_alone']} / {e['law_alone']['fluid']} / {e['law_alone']['per_core']}"
            lines.append(
                f"| {r['regime']['name']} | {i} | {r['path_cores']:.2f} | {e['stepping_share']:.2f} | "
                f"{e['beside_other_share']:.2f} | {e['measured']:.3f} | {e['fluid']:.3f} | "
                f"{e['per_core']:.3f} | "
                f"{alone} | {e['measured_beside']} / {e['law_beside']} |"
            )
    errors = result["summary"]
    lines += [
        "",
        f"Mean error of the law over the engines: fluid {errors['fluid_mean_rel_err']:+.1%} "
        f"(worst {errors['fluid_worst_rel_err']:+.1%}), per core {errors['per_core_mean_rel_err']:+.1%} "
        f"(worst {errors['per_core_worst_rel_err']:+.1%}).",
        "",
    ]
    return "\n".join(lines)


def summary(regimes: list[dict]) -> dict:
    out = {}
    for law in ("fluid", "per_core"):
        errs = [e[law] / e["measured"] - 1 for r in regimes for e in r["engines"]]
        out[f"{law}_mean_rel_err"] = round(sum(errs) / len(errs), 4)
        out[f"{law}_worst_rel_err"] = round(max(errs, key=abs), 4)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=25.0, help="per regime")
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args()
    load_at_start, measured_at = os.getloadavg()[0], time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    regimes = []
    for regime in REGIMES:
        print(f"{regime.name}: {args.seconds:.0f} s", flush=True)
        regimes.append(run(regime, args.seconds))
    command = "python bench/host_sharing.py" + (
        "" if args.seconds == 25.0 else f" --seconds {args.seconds:g}"
    )
    result = {
        "command": command,
        "measured_at": measured_at,
        "cores": os.cpu_count(),
        "seconds": args.seconds,
        "load_avg_1m_at_start": round(load_at_start, 2),
        "regimes": regimes,
        "summary": summary(regimes),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "host_sharing.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "host_sharing.md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
