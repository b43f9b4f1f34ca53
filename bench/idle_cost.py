"""What an idle stack costs: CPU ms per second of each serving process while no request runs.

Starts bench/serve.py's one-replica stack (add `--app` fields, e.g. more ingress replicas), fills the
replica's prefix cache with a few requests (the routing stats then name cached pages, as in service),
waits for the stack to settle, then reads each process's CPU time from /proc over `--seconds`, `--rounds`
times. The ingress' and the replica's idle cost is mostly the routing stats Serve's controller pulls from
every target replica each `routing_stats_period_s` and broadcasts to every handle (ingress, proxy).
CPU time, not wall time: it reads alike on a busy machine (compare runs made in the same hour).

    python bench/idle_cost.py --model models/target [--seconds 10 --rounds 3] [--direct-ingress]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="models/target")
    parser.add_argument("--requests", type=int, default=8, help="distinct prompts run first (cached)")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--settle-s", type=float, default=3.0, help="idle time before measuring")
    parser.add_argument("--app", default="{}", help="more AppConfig fields, as JSON")
    parser.add_argument("--direct-ingress", action="store_true")
    args = parser.parse_args(argv)

    import dspark_client
    from bench.serve import cpu_seconds, serve_pids, start_stack  # bench/serve.py

    engine = {"drafter": "ngram", "num_speculative_tokens": 4, "max_num_seqs": 4}
    _, grpc_target = start_stack(
        str(Path(args.model).resolve()), engine, 1, json.loads(args.app), direct_ingress=args.direct_ingress
    )
    with dspark_client.Client(grpc_target, timeout_s=300) as client:
        for i in range(args.requests):  # each prompt leaves its pages in the prefix cache
            client.generate(f"# task {i}\n" + "def solve(items):\n    " * 8, max_tokens=4, temperature=0.0)
    time.sleep(args.settle_s)  # the last request's traces and stats go out before the measurement
    pids = serve_pids()
    for r in range(args.rounds):
        before = {name: cpu_seconds(p) for name, p in pids.items()}
        start = time.monotonic()
        time.sleep(args.seconds)
        wall = time.monotonic() - start
        cost = {name: 1000 * (cpu_seconds(p) - before[name]) / wall for name, p in pids.items()}
        print(f"round {r + 1}: idle CPU ms per second: " + ", ".join(f"{n} {c:.1f}" for n, c in cost.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
