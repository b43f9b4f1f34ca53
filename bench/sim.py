"""The cluster simulator's benchmark: routing x budget arms at GPU scale, the router's cost at 1,000 replicas,
and validation of the simulator against real Ray Serve on this machine.

    python bench/sim.py --skip-validation    # the simulation (see the Makefile's `sim` for its run time)
    python bench/sim_validate.py --measure-profile   # then the validation, into the same sim.json, with
                                             # the profile measured in the same sitting (about 7.5 min)
    python bench/sim.py                      # both in one go (the validation on the committed profile)
    python bench/sim.py --quick              # a smoke run: tiny fleets, seconds of simulated time

Arms: routers {pow2 (Ray Serve's default), round_robin, sla (router/)} x budgets {fixed (a block of gamma
verified every round), engine (the DSpark scheduler alone), controller (controller/'s policy, when that
package exists)} on the GPU-class profile, at `--replicas` (100 and 1,000) and loads from 50% to 110% of
the fleet's plain-decoding capacity (sim/scenario.py): every arm at every load at 100 replicas, the key
arms at 80% at 1,000 (each 1,000-replica run costs ten 100-replica ones); what ran is in the JSON's
`settings`. The defaults fit about 50 minutes of an idle 2-core machine (the Makefile's `sim` says how
that was measured): 60 s of arrivals at 100 and at 1,000 replicas scored after a 10 s warm-up, a 30 s
trace for the scale section. The 100-replica trace is long enough for the arms that keep up to reach a
steady state (sla + engine at 80% load scores 0.95-0.99 in every 5 s of arrivals over 60 s); an arm over
its capacity has none (pow2 + fixed at 80%: 0.92 in the first 5 s, 0.005 in the last, its running requests
growing from 4.5k to 15k), so its attainment falls as the trace grows: sim.md shows each arm's attainment
by half of the scored window to tell the two apart. Until session 7 the default was 20 s after 5 s, where
that arm scored 0.746 (0.335 over 60 s). The 1,000-replica runs were 4 s until session 22, too short for
an arm over its capacity to fall behind (pow2 + fixed scored 0.969 there, 0.352 over 60 s); their three
key arms now take about 30 CPU-min (389, 686 and 746 CPU-s on one worker).

Scale: the SLA router's decision time at 1,000 replicas (its own candidate draw, router/candidates.py, then
the decision over the drawn, as in Serve; and scoring every replica, for contrast) and the wall and CPU time
of a 1,000-replica trace, extrapolated to the issue's 10 minutes from the trace's loaded second half: a
10-minute trace at 1,000 replicas and 80% load is ~8.7 million requests, held in memory from the start
(several GB), and would run for over an hour here at the rate measured (bench/results/sim.md's Scale line
says which). The trace is 30 s since session 10: the fleet fills for ~12 s (its running requests 13k at 1 s,
41k at 5 s, 57k from 13 s on), and a step costs more the more requests it holds, so the second half of the
earlier 10 s trace (5-10 s, 41-53k running) understated the steady state's CPU per simulated second by about
a tenth (11.4 s against 12.5 s at 13-15 s, one 16 s trace at session 10's code on a shared machine).
Validation: one seeded workload on the real demo stack (two replicas, OpenAI HTTP, streaming; run twice to
show the real cluster's own noise) and in the simulator with this machine's profile, whose SPS table is
replaced by the one the real replicas use; throughput and p50/p99 TTFT and TPOT, both ways
(bench/sim_validate.py: this machine's speed drifts, so its --measure-profile measures the profile between
the two real runs).

Writes bench/results/sim.json, bench/results/sim.md and PNGs (attainment vs load per arm, budget over time).
Each arm runs under one seed; bench/sim_seeds.py runs the summary's arms under more, for its noise band.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from anywhere

from bench.code_version import changed_since, stamp  # noqa: E402
from bench.sim_compare import validation_lines  # noqa: E402
from sim.__main__ import plot, run_grid  # noqa: E402
from sim.scenario import Scenario, run  # noqa: E402

RESULTS = REPO / "bench" / "results"
ROUTERS = ("pow2", "round_robin", "sla")
# At the largest fleet (each run is long) only these, unless --all-arms-1000: the baseline and ours.
KEY_ARMS = {("pow2", "fixed"), ("sla", "engine"), ("sla", "controller")}
# The code that decides an arm's figures: each arm is stamped with the commit it ran at, so a report that
# carries it can say whether this code changed since (bench/code_version.py).
SIM_CODE = ("sim", "router", "dspark", "controller", "deployments/replica_state.py")
# Per arm, what speculation did (sim/scenario.py rounds_work).
WORK = ("verify_per_round", "accepted_per_round", "accepted_share")


def budgets() -> list[str]:
    try:
        import controller.policy  # noqa: F401
    except ImportError:
        return ["fixed", "engine"]
    return ["fixed", "engine", "controller"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a smoke run with tiny settings")
    p.add_argument("--profile", default="gpu_dsv4flash_rocm")
    p.add_argument("--replicas", default="100,1000")
    p.add_argument("--loads", default="0.5,0.8,0.95,1.1")
    p.add_argument("--loads-1000", default="0.8", help="loads at the largest fleet (each run is long)")
    p.add_argument(
        "--duration",
        type=float,
        default=60.0,
        help="simulated seconds of arrivals (long enough for a steady state)",
    )
    p.add_argument("--warmup", type=float, default=10.0, help="simulated seconds not scored")
    p.add_argument("--drain", type=float, default=10.0, help="simulated seconds after the last arrival")
    p.add_argument(
        "--duration-1000", type=float, default=60.0, help="simulated seconds of arrivals at the largest fleet"
    )
    p.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=None,
        help="the engines' step token budget (chunked prefill); default the profile's (GPU class: 2048)",
    )
    p.add_argument("--drain-1000", type=float, default=10.0, help="simulated seconds after the last arrival")
    p.add_argument(
        "--workers",
        type=int,
        default=os.cpu_count() or 1,
        help="arms simulated in parallel processes (the scale section then runs alone, for its timings)",
    )
    p.add_argument(
        "--all-arms-1000", action="store_true", help="every arm at the largest fleet, not only the key three"
    )
    p.add_argument(
        "--scale-duration",
        type=float,
        default=30.0,
        help="simulated seconds of the 1,000-replica trace timed, extrapolated from its second half (30: "
        "the fleet fills for ~10 s, then runs at ~40 requests a replica; 600: the issue's 10 minutes as "
        "such, ~8.7 million requests, several GB, over an hour here)",
    )
    p.add_argument("--skip-validation", action="store_true")
    p.add_argument("--skip-scale", action="store_true")
    p.add_argument(
        "--scale-from",
        type=Path,
        default=None,
        help="take the scale section from an earlier report (its timings need an idle machine, the arms' "
        "simulated figures do not: arms can then run beside other work)",
    )
    p.add_argument(
        "--arms-from",
        type=Path,
        default=None,
        help="take the arms from an earlier report (deterministic: they need no idle machine) and run "
        "only what else is asked for, e.g. the scale section on an idle machine",
    )
    p.add_argument(
        "--rerun-fleets",
        default="",
        help="with --arms-from: simulate the arms at these fleet sizes again (comma-separated) with this "
        "command's settings, carrying the others (e.g. 1000 with a longer --duration-1000)",
    )
    p.add_argument("--models", default="models")
    p.add_argument(
        "--val-drafter", default="dspark", help="ngram: validate a stack without trained drafters (smoke)"
    )
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    if args.quick:
        args.replicas, args.loads, args.loads_1000 = "4,20", "0.8", "0.8"
        args.duration, args.duration_1000, args.drain_1000, args.scale_duration = 8.0, 4.0, 4.0, 0.2
    args.out = args.out or (REPO / "build" / "sim_quick" if args.quick else RESULTS)
    return args


def arms(args: argparse.Namespace, only: set[int] | None = None) -> list[dict]:
    """Every arm of every fleet (`only`: of these fleet sizes)."""
    fleets = [int(x) for x in args.replicas.split(",")]
    scenarios = []
    for n in fleets:
        if only is not None and n not in only:
            continue
        largest = n == max(fleets) and len(fleets) > 1
        loads = [float(x) for x in (args.loads_1000 if largest else args.loads).split(",")]
        duration = args.duration_1000 if largest else args.duration
        scenarios += [
            Scenario(
                profile=args.profile,
                replicas=n,
                router=router,
                scheduler=budget,
                load=load,
                duration_s=duration,
                warmup_s=min(args.warmup, duration / 4),
                drain_s=min(args.drain_1000 if largest else args.drain, 2 * duration),
                max_num_batched_tokens=args.max_num_batched_tokens,
            )
            for router in ROUTERS
            for budget in budgets()
            for load in loads
            if not largest or args.all_arms_1000 or (router, budget) in KEY_ARMS
        ]
    results = run_grid(scenarios, desc=f"{args.replicas} replicas", workers=args.workers)
    code = stamp(REPO, SIM_CODE)
    return [{**r, "code": code} for r in results]


def arms_code(results: list[dict], repo: Path = REPO) -> dict[str, dict]:
    """Per fleet: the commits its arms ran at, whether any ran with uncommitted changes to SIM_CODE, and
    the files of SIM_CODE changed since (None: unrecorded, an arm without a stamp or a commit not here)."""
    out: dict[str, dict] = {}
    for n in sorted({r["scenario"]["replicas"] for r in results}):
        stamps = [r.get("code") or {} for r in results if r["scenario"]["replicas"] == n]
        commits = sorted({st.get("commit") for st in stamps}, key=str)
        changed = [changed_since(repo, c, SIM_CODE) for c in commits]
        out[str(n)] = {
            "commits": commits,
            "dirty": any(st.get("dirty") for st in stamps),
            "changed_since": None if None in changed else sorted({f for c in changed for f in c}),
        }
    return out


def code_lines(code: dict[str, dict]) -> list[str]:
    """What the report says of each fleet's code: unrecorded, unchanged since, or the files changed."""
    lines = []
    for n, c in code.items():
        changed = c["changed_since"]
        if changed is None:
            lines.append(
                f"The arms at {n} replicas ran at an unrecorded commit: whether the simulated code "
                "changed since is unknown.\n"
            )
            continue
        at = ", ".join(commit[:10] for commit in c["commits"])
        dirty = " with uncommitted changes to it" if c["dirty"] else ""
        if changed:
            shown = ", ".join(changed[:8]) + (f" and {len(changed) - 8} more" if len(changed) > 8 else "")
            files = f"{len(changed)} file{'s' if len(changed) > 1 else ''}"
            lines.append(
                f"The arms at {n} replicas ran at {at}{dirty}; the simulated code changed since in "
                f"{files} ({shown}): simulate them again to trust them.\n"
            )
        else:
            lines.append(
                f"The arms at {n} replicas ran at {at}{dirty}; the simulated code is unchanged since.\n"
            )
    return lines


def scale(args: argparse.Namespace) -> dict:
    """The SLA router's decision time at 1,000 replicas and the wall time of a 1,000-replica trace."""
    n = 1000
    s = Scenario(
        profile=args.profile,
        replicas=n,
        router="sla",
        scheduler="engine",
        load=0.8,
        duration_s=args.scale_duration,
        warmup_s=0.0,
        drain_s=0.0,
        max_num_batched_tokens=args.max_num_batched_tokens,
    )
    # Wall and CPU time of the trace's second half, the loaded part (it starts from an empty fleet). The
    # CPU time is this process's own: on a shared machine it is what the simulation costs, the wall is not.
    half = [math.inf, math.inf]

    def tick(now: float) -> None:
        if now >= s.duration_s / 2 and half[0] == math.inf:
            half[:] = [time.perf_counter(), time.process_time()]

    result = run(s, tick)
    loaded_wall, loaded_cpu = time.perf_counter() - half[0], time.process_time() - half[1]
    cluster = result.pop("cluster")
    # Scoring every replica (no candidate draw) on the final state, for contrast.
    arm = cluster.router
    stats = {r.replica_id: arm.stats(r.replica_id) for r in cluster.replicas}
    pending = [r for r in cluster.requests if r.outcome == "pending"][:50] or cluster.requests[:50]
    full = []
    for req in pending:
        start = time.thread_time()
        arm.balancer.decide(arm.newcomer(req), f"probe-{req.rid}", stats, cluster.q.now)
        full.append(time.thread_time() - start)
    full.sort()
    # The router's own part of the loaded half: its decisions' CPU (draw and decide). Requests arrive at a
    # constant rate, so the later half of the decisions is the trace's second half. Beside the whole run's
    # CPU it says how much of the 10-minute budget the real policy alone takes, before any replica steps.
    later = arm.decision_cpu_s[len(arm.decision_cpu_s) // 2 :]
    decisions_cpu = sum(later)
    loaded_s = args.scale_duration / 2  # simulated seconds of the loaded half
    to_10min = 600.0 / loaded_s
    # The trace starts from an empty fleet: its second half is the loaded steady state.
    steady = {
        name: sorted(times[len(times) // 2 :])
        for name, times in (("", arm.decision_s), ("_cpu", arm.decision_cpu_s))
    }
    return {
        "replicas": n,
        "candidates": s.candidates,
        "decision_p50_ms_1000": result.get("decision_p50_ms"),
        "decision_p99_ms_1000": result.get("decision_p99_ms"),
        # The decision's own CPU time (thread time): the wall p99 above includes preemption on a busy host.
        "decision_cpu_p50_ms_1000": result.get("decision_cpu_p50_ms"),
        "decision_cpu_p99_ms_1000": result.get("decision_cpu_p99_ms"),
        **{
            f"decision{name}_p99_ms_1000_second_half": round(1e3 * t[int(0.99 * (len(t) - 1))], 4)
            for name, t in steady.items()
            if t
        },
        "decision_cpu_p99_ms_1000_all_scored": round(1e3 * full[int(0.99 * (len(full) - 1))], 3)
        if full
        else None,
        "simulated_s": args.scale_duration,
        "wall_s": result["wall_s"],
        "wall_s_10min_1000": round(loaded_wall * to_10min, 1) if math.isfinite(loaded_wall) else None,
        "wall_s_10min_1000_whole_trace": round(result["wall_s"] * 600.0 / args.scale_duration, 1),
        "cpu_s": result["cpu_s"],
        "cpu_s_10min_1000": round(loaded_cpu * to_10min, 1) if math.isfinite(loaded_cpu) else None,
        "decision_cpu_s_10min_1000": round(decisions_cpu * to_10min, 1),
        "decisions_per_simulated_s": round(len(later) / loaded_s, 1),
        "decision_cpu_share": round(decisions_cpu / loaded_cpu, 3)
        if math.isfinite(loaded_cpu) and loaded_cpu > 0
        else None,
        "extrapolated": args.scale_duration < 600.0,
        "events": result["events"],
        "requests": result["summary"]["requests"],
    }


def settings(args: argparse.Namespace, results: list[dict]) -> dict:
    """What ran: per fleet, its arms, loads and simulated seconds, and the CPU the runs took."""
    fleets: dict[int, dict] = {}
    for r in results:
        s = r["scenario"]
        f = fleets.setdefault(s["replicas"], {"arms": [], "loads": [], "runs": 0, "cpu_s": 0.0})
        arm = f"{s['router']}+{s['scheduler']}"
        f["arms"] += [arm] if arm not in f["arms"] else []
        f["loads"] += [s["load"]] if s["load"] not in f["loads"] else []
        f.update(duration_s=s["duration_s"], warmup_s=s["warmup_s"], drain_s=s["drain_s"])
        f["runs"] += 1
        f["cpu_s"] = round(f["cpu_s"] + r.get("cpu_s", 0.0), 1)
    return {
        "profile": args.profile,
        "fleets": {str(n): {**f, "loads": sorted(f["loads"])} for n, f in sorted(fleets.items())},
        "workers": args.workers,
        "scale_duration_s": None if args.skip_scale or args.scale_from else args.scale_duration,
        "max_num_batched_tokens": args.max_num_batched_tokens or "profile's",
        "quick": args.quick,
    }


def summary(results: list[dict]) -> dict:
    """At 80% load, ours vs power-of-two + fixed block: on the fleet that ran every arm (the longest runs),
    the largest such fleet on a tie; the same figures on the largest fleet, when that is another one."""
    at = [r for r in results if abs(r["scenario"]["load"] - 0.8) < 1e-9]
    arms_by_fleet: dict[int, set] = {}
    for r in at:
        arms_by_fleet.setdefault(r["scenario"]["replicas"], set()).add(
            (r["scenario"]["router"], r["scenario"]["scheduler"])
        )
    if not arms_by_fleet:
        return {}
    main = max(arms_by_fleet, key=lambda n: (len(arms_by_fleet[n]), n))
    out = _compare(results, at, main)
    largest = max(arms_by_fleet)
    if out and largest != main:
        out["largest_fleet"] = _compare(results, at, largest)
    return out


def _compare(results: list[dict], at: list[dict], n: int) -> dict:
    runs = {
        (r["scenario"]["router"], r["scenario"]["scheduler"]): r for r in at if r["scenario"]["replicas"] == n
    }
    cell = {arm: r["summary"] for arm, r in runs.items()}
    ours_arm = ("sla", "controller") if ("sla", "controller") in cell else ("sla", "engine")
    ours, base = cell.get(ours_arm), cell.get(("pow2", "fixed"))
    if not ours or not base:
        return {}
    # The speculation each arm ran beside its goodput: a gain is credited only with the work that made it.
    work = {
        "+".join(arm): {k: runs[arm][k] for k in WORK if k in runs[arm]}
        for arm in (ours_arm, ("pow2", "fixed"))
    }
    return {
        "replicas": n,
        "ours": "sla + controller"
        if ("sla", "controller") in cell
        else "sla + engine (controller/ not landed)",
        "goodput_ratio_vs_pow2_fixed_at_80pct": round(ours["goodput_rps"] / base["goodput_rps"], 4)
        if base["goodput_rps"]
        else None,
        "attainment_at_80pct": ours["attainment"],
        "attainment_pow2_fixed_at_80pct": base["attainment"],
        "goodput_at_sla": goodput_at_sla(results, n),
        "work_at_80pct": work,
    }


def goodput_at_sla(results: list[dict], n: int) -> dict:
    """DistServe's goodput per arm: the highest offered rate (interpolated) with attainment >= 90%."""
    out = {}
    arms_: dict[str, list[dict]] = {}
    for r in results:
        if r["scenario"]["replicas"] == n:
            arms_.setdefault(f"{r['scenario']['router']}+{r['scenario']['scheduler']}", []).append(r)
    for name, rows in arms_.items():
        rows.sort(key=lambda r: r["offered_rps"])
        best = None
        for lo, hi in zip([None, *rows], rows):
            a = hi["summary"]["attainment"]
            if a >= 0.9:
                best = hi["offered_rps"]
            elif lo is not None and lo["summary"]["attainment"] >= 0.9:
                a0, a1 = lo["summary"]["attainment"], a
                best = lo["offered_rps"] + (hi["offered_rps"] - lo["offered_rps"]) * (a0 - 0.9) / (a0 - a1)
                break
            else:
                break
        out[name] = None if best is None else round(best, 3)
    return out


def markdown(report: dict) -> str:
    lines = [f"# Cluster simulator\n\n`{report['command']}` — {report['wall_minutes']} min\n"]
    if "arms_carried_from" in report:
        lines.append(f"The arms below are carried from `{report['arms_carried_from']}`.\n")
    for n, source in (report.get("arms_simulated_by") or {}).items():
        lines.append(f"The arms at {n} replicas were simulated by `{source}`.\n")
    lines.extend(code_lines(report.get("arms_code") or {}))
    lines.append(
        "| replicas | router | budget | load | attainment | 1st / 2nd half | goodput req/s | TTFT p99 s "
        "| TPOT p99 s | verify/round | accepted/round | accepted share |"
    )
    lines.append("|---:|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|")
    for r in report["arms"]:
        s, m = r["scenario"], r["summary"]
        lines.append(
            f"| {s['replicas']} | {s['router']} | {s['scheduler']} | {s['load']:.2f} "
            f"| {m['attainment']:.3f} | {_halves(m)} | {m['goodput_rps']:.2f} | {m['ttft_p99_s']} "
            f"| {m['tpot_p99_s']} | {r['verify_per_round']:.2f} | {_work(r, 'accepted_per_round')} "
            f"| {_work(r, 'accepted_share', 3)} |"
        )
    lines.append(
        "\n1st / 2nd half: attainment of the requests that arrived in each half of the scored window; a "
        "second half well below the first is an arm over its capacity, whose queue grows for as long as "
        "the trace runs (its attainment has no steady state and falls with the trace's length). "
        "verify/round and accepted/round: drafts the target verified and accepted per request-round (one "
        "request's share of a step); accepted share: the second over the first."
    )
    lines.append(f"\nSummary: `{json.dumps(report['summary'])}`\n")
    lines.append(f"Scale: `{json.dumps(report['scale'])}`\n")
    lines.extend(validation_lines(report["validation"]))
    return "\n".join(lines)


def _work(arm: dict, key: str, digits: int = 2) -> str:
    value = arm.get(key)  # absent from runs before it was recorded
    return "-" if value is None else f"{value:.{digits}f}"


def _halves(summary: dict) -> str:
    halves = summary.get("attainment_halves") or [None, None]  # absent from runs before it was recorded
    return " / ".join("-" if a is None else f"{a:.3f}" for a in halves)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    start = time.time()
    args.out.mkdir(parents=True, exist_ok=True)
    earlier = json.loads(args.arms_from.read_text()) if args.arms_from else None
    rerun = {int(x) for x in args.rerun_fleets.split(",") if x} if earlier else set()
    command = "python bench/sim.py " + " ".join(argv if argv is not None else sys.argv[1:])
    if earlier is None:
        results = arms(args)
    else:
        kept = [r for r in earlier["arms"] if r["scenario"]["replicas"] not in rerun]
        results = kept + (arms(args, rerun) if rerun else [])
    report = {
        "command": command,
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
        },
        "settings": settings(args, results),
        # Where the arms were simulated: a report that carried them already names that run.
        **(arm_sources(earlier, rerun, command, results) if earlier else {}),
        "arms_code": arms_code(results),
        "budgets": budgets(),
        "arms": results,
        "summary": summary(results),
        "scale": scale_section(args),
        "validation": {"skipped": "--skip-validation"} if args.skip_validation else validate(args),
    }
    report["wall_minutes"] = round((time.time() - start) / 60, 2)
    name = "sim"
    (args.out / f"{name}.json").write_text(json.dumps(report, indent=1))
    (args.out / f"{name}.md").write_text(markdown(report))
    paths = plot(results, args.out)
    print(markdown(report))
    print("wrote", args.out / f"{name}.json", *paths)


def arm_sources(earlier: dict, rerun: set[int], command: str, results: list[dict]) -> dict:
    """The command that simulated the arms: all carried, the earlier report's source; some simulated
    again here, the command per fleet size (`arms_simulated_by`)."""
    if not rerun and "arms_simulated_by" not in earlier:
        return {"arms_carried_from": earlier.get("arms_carried_from", earlier["command"])}
    before = earlier.get("arms_simulated_by") or {}
    origin = earlier.get("arms_carried_from", earlier["command"])
    fleets = sorted({r["scenario"]["replicas"] for r in results})
    return {
        "arms_simulated_by": {str(n): command if n in rerun else before.get(str(n), origin) for n in fleets}
    }


def scale_section(args: argparse.Namespace) -> dict:
    """The scale section: measured here, taken from an earlier report (saying which run measured it), or
    skipped."""
    if args.scale_from:
        earlier = json.loads(args.scale_from.read_text())
        # Carried again, it still names the run that measured it, not the one that carried it.
        return {**earlier["scale"], "carried_from": earlier["scale"].get("carried_from", earlier["command"])}
    return {} if args.skip_scale else scale(args)


def validate(args: argparse.Namespace) -> dict:
    from bench.sim_validate import validate as run_validation

    # The simulated half under six seeds (its figure their mean, their spread beside): seconds each.
    return run_validation(
        args.models, quick=args.quick, drafter=args.val_drafter, sim_seeds=1 if args.quick else 6
    )


if __name__ == "__main__":
    main()
