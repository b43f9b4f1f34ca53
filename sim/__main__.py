"""python -m sim: simulate a grid of arms and loads; write results JSON and PNGs.

    python -m sim --profile gpu_dsv4flash_rocm --replicas 100 --router pow2,sla
                  --scheduler fixed,engine --load 0.5,0.8,1.1 --duration 120 --out build/sim
    (one command line; the other options: --pattern bursty|diurnal, --hetero, --slow-share, --failures)

Every (router, scheduler, load) cell runs the same seeded workload shape. Writes OUT/sim.json (settings
and per-cell summaries), OUT/attainment.png (SLA attainment vs load per arm) and OUT/budget.png (mean
verified drafts per request-round and output tokens/s over time, per arm, at the highest load).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing
from pathlib import Path

from tqdm import tqdm

from sim.profiles import available
from sim.scenario import Scenario, run


def _list(kind):
    return lambda s: [kind(x) for x in s.split(",") if x]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m sim", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--profile", default="gpu_dsv4flash_rocm", choices=available())
    p.add_argument("--replicas", type=int, default=10)
    p.add_argument("--router", type=_list(str), default=["pow2", "round_robin", "sla"])
    p.add_argument("--scheduler", type=_list(str), default=["fixed", "engine"])
    p.add_argument("--load", type=_list(float), default=[0.5, 0.8, 1.1])
    p.add_argument("--duration", type=float, default=60.0, help="simulated seconds of arrivals")
    p.add_argument("--warmup", type=float, default=10.0)
    p.add_argument("--drain", type=float, default=60.0)
    p.add_argument("--pattern", default="poisson", choices=("poisson", "bursty", "diurnal"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--slow-share", type=float, default=0.0)
    p.add_argument("--hetero", action="store_true", help="half the fleet a 2x faster class")
    p.add_argument("--failures", type=int, default=0)
    p.add_argument("--candidates", type=int, default=8, help="replicas the SLA router scores per request")
    p.add_argument(
        "--calibrate-tpot",
        action="store_true",
        help="the SLA router scales its TPOT by each replica's measured decode steps",
    )
    p.add_argument(
        "--max-num-batched-tokens", type=int, default=None, help="the engines' step token budget (profile's)"
    )
    p.add_argument("--workers", type=int, default=1, help="scenarios simulated in parallel processes")
    p.add_argument("--out", default="build/sim")
    return p.parse_args(argv)


def grid(args: argparse.Namespace) -> list[Scenario]:
    return [
        Scenario(
            profile=args.profile,
            replicas=args.replicas,
            router=router,
            scheduler=scheduler,
            load=load,
            duration_s=args.duration,
            warmup_s=args.warmup,
            drain_s=args.drain,
            pattern=args.pattern,
            seed=args.seed,
            slow_share=args.slow_share,
            hetero=args.hetero,
            failures=args.failures,
            candidates=args.candidates,
            calibrate_tpot=args.calibrate_tpot,
            max_num_batched_tokens=args.max_num_batched_tokens,
        )
        for router in args.router
        for scheduler in args.scheduler
        for load in args.load
    ]


def run_grid(scenarios: list[Scenario], desc: str = "simulating", workers: int = 1) -> list[dict]:
    """Run every scenario with one progress bar over simulated seconds; results in the scenarios' order.

    With `workers` > 1 the scenarios run in that many processes (each is seeded on its own, so the
    results are the same), the largest first; the bar then moves as each one finishes.
    """
    total = sum(s.duration_s + s.drain_s for s in scenarios)
    with tqdm(total=round(total), desc=desc, unit="sim s", disable=None) as bar:
        if workers > 1 and len(scenarios) > 1:
            return _run_parallel(scenarios, workers, bar)
        results = []
        for s in scenarios:
            done = [0]

            def tick(now: float, done=done) -> None:
                if now - done[0] >= 1.0:
                    bar.update(int(now - done[0]))
                    done[0] = int(now)

            result = run(s, tick)
            bar.update(round(s.duration_s + s.drain_s) - done[0])
            bar.set_postfix(arm=f"{s.router}+{s.scheduler}", load=s.load)
            result.pop("cluster")
            results.append(result)
    return results


def _run_parallel(scenarios: list[Scenario], workers: int, bar: tqdm) -> list[dict]:
    results: list[dict | None] = [None] * len(scenarios)
    cost = sorted(range(len(scenarios)), key=lambda i: -scenarios[i].replicas * (scenarios[i].duration_s))
    # Spawned, not forked: the caller may hold threads (a Ray client, a test session) that fork would copy.
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(min(workers, len(scenarios)), mp_context=context) as pool:
        futures = {pool.submit(_run_detached, scenarios[i]): i for i in cost}
        for future in concurrent.futures.as_completed(futures):
            i = futures[future]
            results[i] = future.result()
            s = scenarios[i]
            bar.update(round(s.duration_s + s.drain_s))
            bar.set_postfix(arm=f"{s.router}+{s.scheduler}", load=s.load, replicas=s.replicas)
    return results  # type: ignore[return-value]


def _run_detached(scenario: Scenario) -> dict:
    result = run(scenario)
    result.pop("cluster")
    return result


def plot(results: list[dict], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms: dict[str, list[dict]] = {}
    fleets = {r["scenario"]["replicas"] for r in results}
    for r in results:
        s = r["scenario"]
        label = f"{s['router']} + {s['scheduler']}" + (f" ({s['replicas']})" if len(fleets) > 1 else "")
        arms.setdefault(label, []).append(r)
    # Nine arms or more: colour by router, line by budget, marker by fleet, so no two arms look alike.
    colours = {"pow2": "tab:green", "round_robin": "tab:purple", "sla": "tab:blue"}
    lines = {"fixed": ":", "engine": "--", "controller": "-"}
    markers = dict(zip(sorted(fleets), "os^Dv"))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, rows in sorted(arms.items()):
        rows = sorted(rows, key=lambda r: r["scenario"]["load"])
        s = rows[0]["scenario"]
        ax.plot(
            [r["scenario"]["load"] for r in rows],
            [r["summary"]["attainment"] for r in rows],
            color=colours.get(s["router"]),
            linestyle=lines.get(s["scheduler"], "-"),
            marker=markers[s["replicas"]],
            label=name,
        )
    ax.set_xlabel("offered load (fraction of plain-decoding capacity)")
    ax.set_ylabel("SLA attainment")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    paths = [out / "attainment.png"]
    fig.savefig(paths[0], dpi=120)
    plt.close(fig)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 5), sharex=True)
    largest = max(fleets, default=0)
    for name, rows in sorted(arms.items()):
        if rows[0]["scenario"]["replicas"] != largest:
            continue
        r = max(rows, key=lambda r: r["scenario"]["load"])
        tl = r["timeline"]
        top.plot(tl["t"], tl["verify_per_round"], label=name)
        bottom.plot(tl["t"], tl["tokens_per_s"], label=name)
    top.set_ylabel("verified drafts / request-round")
    bottom.set_ylabel("output tok/s")
    bottom.set_xlabel("simulated s")
    top.legend(fontsize=8)
    fig.tight_layout()
    paths.append(out / "budget.png")
    fig.savefig(paths[1], dpi=120)
    plt.close(fig)
    return paths


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = run_grid(grid(args), workers=args.workers)
    (out / "sim.json").write_text(json.dumps({"args": vars(args), "runs": results}, indent=1))
    paths = plot(results, out)
    for r in results:
        s, m = r["scenario"], r["summary"]
        print(
            f"{s['router']:>11} + {s['scheduler']:<6} load {s['load']:.2f}: attainment {m['attainment']:.3f} "
            f"goodput {m['goodput_rps']:.2f} req/s, TTFT p99 {m['ttft_p99_s']} s, "
            f"TPOT p99 {m['tpot_p99_s']} s"
        )
    print(f"wrote {out / 'sim.json'}, " + ", ".join(map(str, paths)))


if __name__ == "__main__":
    main()
