"""The simulator's own cost as work done, not time: one seeded trace, to run under a counter of instructions.

On a shared two-core machine the same simulation runs 20-30 % faster or slower from one run to the next,
so a speed-up of that size cannot be shown with a clock. Instructions can: under callgrind a run counts
the same every time. The difference between the trace and a run of no simulated seconds (the imports and
the set-up alone) is the simulation's work:

    PYTHONHASHSEED=0 valgrind --tool=callgrind --callgrind-out-file=/dev/null \\
        python bench/sim_work.py --replicas 60 --duration 8      # "Collected : N" instructions
    PYTHONHASHSEED=0 valgrind --tool=callgrind --callgrind-out-file=/dev/null \\
        python bench/sim_work.py --replicas 60 --duration 0      # the baseline to subtract

(about 4 minutes each under callgrind; `apt install valgrind`). Run it on two commits to compare their
work; it prints the trace's outcome digest too, so the two can be seen to simulate the same thing (a
change meant only to make the simulator faster must leave it alone: tests/sim/test_simulator.py pins two).
Without valgrind it runs as a plain simulation and prints its wall time beside the digest.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from sim.scenario import Scenario, run  # noqa: E402


def outcome_digest(cluster) -> str:
    """Every request's outcome and times and every replica's counters, hashed (the attention counters
    left out where they are 0, as they are unless the profile prices attention: the digests pinned
    before they existed stay)."""
    digest = hashlib.sha256()
    for r in cluster.requests:
        digest.update(
            repr(
                (r.rid, r.outcome, r.replica, r.first_token, r.finish, r.generated, r.admitted, r.scheduled)
            ).encode()
        )
    for replica in cluster.all_replicas():
        counters = vars(replica.counters)
        unpriced = {k for k, v in counters.items() if k.startswith("attention_") and v == 0}
        plain = sorted((k, v) for k, v in counters.items() if k != "verify_accept" and k not in unpriced)
        digest.update(repr((replica.replica_id, plain, sorted(counters["verify_accept"].items()))).encode())
    return digest.hexdigest()


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profile", default="gpu_dsv4flash_rocm")
    p.add_argument("--replicas", type=int, default=60)
    p.add_argument(
        "--duration", type=float, default=8.0, help="simulated seconds of arrivals (0: set-up only)"
    )
    p.add_argument("--load", type=float, default=0.8)
    p.add_argument("--router", default="sla")
    p.add_argument("--scheduler", default="engine")
    args = p.parse_args(argv)
    scenario = Scenario(
        profile=args.profile,
        replicas=args.replicas,
        router=args.router,
        scheduler=args.scheduler,
        load=args.load,
        duration_s=args.duration if args.duration > 0 else 1.0,  # the baseline builds one, never runs it
        warmup_s=0.0,
        drain_s=0.0,
    )
    if args.duration <= 0:  # the baseline: imports and set-up, nothing simulated
        scenario.build()
        out = {"events": 0}
    else:
        start = time.perf_counter()
        result = run(scenario)
        out = {
            "events": result["events"],
            "requests": len(result["cluster"].requests),
            "digest": outcome_digest(result["cluster"]),
            "wall_s": round(time.perf_counter() - start, 3),
        }
    print(out)
    return out


if __name__ == "__main__":
    main()
