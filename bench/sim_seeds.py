"""The simulated arms' noise band: the summary's figures at 80% load under other seeds.

bench/sim.py runs each arm under one seed (0: the workload's arrivals, lengths, classes and domains, the
replicas' acceptance draws, the router's candidate draw) and its summary sets ours (sla + controller)
against power-of-two + fixed block at 80% load. One seed says nothing of how far those figures move with
the draws. This runs the summary's arms (and sla + engine) again at 80% under further seeds, with the very
settings sim.json recorded for them (its arms' own scenarios, the seed changed), and reports per seed each
arm's attainment, goodput and drafts verified and accepted per request-round, and ours over the baseline;
then each figure's range over all the seeds, seed 0's taken from sim.json.

    python bench/sim_seeds.py [--seeds 1,2] [--replicas 100] [--workers 2] [--report bench/results/sim.json]
    python bench/sim_seeds.py --quick     # a smoke run: a tiny fleet for seconds, seed 0 simulated too

Writes bench/results/sim_seeds_<replicas>.json and .md, one pair per fleet (build/sim_quick with --quick).
The 1,000-replica arms take 390-750 CPU-s each: `--replicas 1000` runs six of them (23.7 minutes on two
workers, bench/results/sim_seeds_1000.md).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from anywhere

from bench.sim import KEY_ARMS  # noqa: E402
from sim.__main__ import run_grid  # noqa: E402
from sim.scenario import Scenario  # noqa: E402

RESULTS = REPO / "bench" / "results"
ARMS = tuple(sorted(KEY_ARMS))  # the summary's arms: the baseline, ours, and sla + engine beside
OURS, BASELINE = "sla+controller", "pow2+fixed"
LOAD = 0.8
FIGURES = ("attainment", "goodput_rps", "verify_per_round", "accepted_per_round")


def arm_name(scenario: dict) -> str:
    return f"{scenario['router']}+{scenario['scheduler']}"


def recorded_scenarios(report: dict, replicas: int) -> dict[str, dict]:
    """The summary's arms at 80% load and `replicas` as sim.json ran them: {arm: its result}."""
    out = {}
    for r in report["arms"]:
        s = r["scenario"]
        if (
            s["replicas"] == replicas
            and abs(s["load"] - LOAD) < 1e-9
            and (s["router"], s["scheduler"]) in ARMS
        ):
            out[arm_name(s)] = r
    missing = {"+".join(a) for a in ARMS} - set(out)
    if missing:
        raise SystemExit(f"the report has no run of {sorted(missing)} at {replicas} replicas and load {LOAD}")
    return out


def figures(result: dict) -> dict:
    """One run's figures: attainment and goodput from its summary, the speculation's work beside."""
    summary = result["summary"]
    return {
        "attainment": summary["attainment"],
        "goodput_rps": summary["goodput_rps"],
        "verify_per_round": result.get("verify_per_round"),
        "accepted_per_round": result.get("accepted_per_round"),
    }


def by_seed(runs: Sequence[tuple[int, str, dict]]) -> dict[int, dict]:
    """{seed: {arm: figures, "ratio": ours' goodput over the baseline's}} from (seed, arm, figures)."""
    out: dict[int, dict] = {}
    for seed, arm, figs in runs:
        out.setdefault(seed, {})[arm] = figs
    for row in out.values():
        base = row.get(BASELINE, {}).get("goodput_rps")
        ours = row.get(OURS, {}).get("goodput_rps")
        row["ratio"] = round(ours / base, 4) if ours is not None and base else None
    return dict(sorted(out.items()))


def spread(seeds: dict[int, dict]) -> dict:
    """Each arm's figures and the ratio over the seeds: (least, most) and the most over the least less 1
    (for the figures that are all positive)."""
    out: dict = {}
    arms = sorted({a for row in seeds.values() for a in row if a != "ratio"})
    for arm in arms:
        out[arm] = {}
        for f in FIGURES:
            values = [row[arm][f] for row in seeds.values() if arm in row and row[arm].get(f) is not None]
            if values:
                out[arm][f] = _range(values)
    ratios = [row["ratio"] for row in seeds.values() if row.get("ratio") is not None]
    out["ratio"] = _range(ratios) if ratios else None
    return out


def _range(values: list[float]) -> dict:
    lo, hi = min(values), max(values)
    return {"min": lo, "max": hi, "spread": round(hi / lo - 1, 4) if lo > 0 else None}


def markdown(report: dict) -> str:
    lines = [
        f"# Simulated arms under other seeds\n\n`{report['command']}` ({report['wall_minutes']} min): "
        f"{report['replicas']} replicas at {LOAD:.0%} load, the settings of {report['source']}'s arms, "
        f"seeds {', '.join(str(s) for s in report['seeds'])} (seed 0 from {report['seed0']}).\n",
        "| seed | arm | attainment | goodput req/s | verify/round | accepted/round |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    for seed, row in report["by_seed"].items():
        for arm in sorted(a for a in row if a != "ratio"):
            f = row[arm]
            lines.append(
                f"| {seed} | {arm} | {f['attainment']:.3f} | {f['goodput_rps']:.1f} "
                f"| {_fmt(f['verify_per_round'])} | {_fmt(f['accepted_per_round'])} |"
            )
    lines.append("\n| seed | goodput ours (sla + controller) over power-of-two + fixed block |\n|---:|---:|")
    lines += [f"| {seed} | {_fmt(row['ratio'], 3)} |" for seed, row in report["by_seed"].items()]
    lines.append("\nOver the seeds (least / most, spread = most over least less 1):\n")
    lines.append("| arm | figure | least | most | spread |\n|---|---|---:|---:|---:|")
    for arm, figs in report["spread"].items():
        if arm == "ratio" or not figs:
            continue
        for f, r in figs.items():
            lines.append(f"| {arm} | {f} | {r['min']} | {r['max']} | {_pct(r['spread'])} |")
    if report["spread"].get("ratio"):
        r = report["spread"]["ratio"]
        lines.append(f"| ours / baseline | goodput ratio | {r['min']} | {r['max']} | {_pct(r['spread'])} |")
    return "\n".join(lines) + "\n"


def _fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", default="1,2", help="seeds beside sim.json's 0 (comma-separated)")
    p.add_argument("--replicas", type=int, default=100)
    p.add_argument("--report", type=Path, default=RESULTS / "sim.json", help="the arms' settings and seed 0")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="a tiny fleet for seconds; seed 0 simulated too")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    args.out = args.out or (REPO / "build" / "sim_quick" if args.quick else RESULTS)
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    start = time.time()
    seeds = [int(s) for s in args.seeds.split(",") if s]
    command = "python bench/sim_seeds.py " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.quick:  # no report to follow: the arms at tiny settings, seed 0 among the simulated
        base = {
            "+".join(a): Scenario(
                replicas=4, router=a[0], scheduler=a[1], load=LOAD, duration_s=6.0, warmup_s=1.0, drain_s=4.0
            )
            for a in ARMS
        }
        seeds, recorded, source = sorted({0, *seeds}), {}, "--quick"
    else:
        recorded = recorded_scenarios(json.loads(args.report.read_text()), args.replicas)
        base = {
            arm: Scenario(**{**r["scenario"], "workload": r["scenario"].get("workload") or {}})
            for arm, r in recorded.items()
        }
        source = str(args.report.relative_to(REPO) if args.report.is_relative_to(REPO) else args.report)
    scenarios = [replace(s, seed=seed) for seed in seeds for s in base.values()]
    results = run_grid(scenarios, desc=f"{len(seeds)} seeds", workers=args.workers)
    runs = [(s.seed, f"{s.router}+{s.scheduler}", figures(r)) for s, r in zip(scenarios, results)]
    runs += [(0, arm, figures(r)) for arm, r in recorded.items()]
    table = by_seed(runs)
    report = {
        "command": command,
        "source": source,
        "replicas": scenarios[0].replicas,
        "seeds": sorted(table),
        "seed0": source if recorded else "simulated here",
        "by_seed": table,
        "spread": spread(table),
        "wall_minutes": round((time.time() - start) / 60, 2),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"sim_seeds_{report['replicas']}"
    (args.out / f"{stem}.json").write_text(json.dumps(report, indent=1))
    (args.out / f"{stem}.md").write_text(markdown(report))
    print(markdown(report))
    return report


if __name__ == "__main__":
    main()
