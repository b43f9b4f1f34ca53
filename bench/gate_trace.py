"""The draft gate's inputs and decisions on the simulator validation's trace, one engine outside Ray.

bench/sim_validate.py's real half serves its seeded trace on two replicas; this feeds one engine (the
same engine settings, one torch thread) the requests of one of them (every other request, `--part`),
each at its arrival time, and logs every round that drafted: the decoding requests, accepted and
verified drafts, the drafting seconds, the probe interval before it, the gate's state after it
(DraftGate.to_dict) and whether drafting pays by that state. Run two at once (`--part 0` and
`--part 1`) for the validation's two engines on this machine's two cores.

    python bench/gate_trace.py --models models --part 0 --seconds 60 &
    python bench/gate_trace.py --models models --part 1 --seconds 60

Prints a summary; --out FILE also writes the rounds there as JSON lines.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from anywhere


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", type=Path, default=REPO / "models")
    p.add_argument("--part", type=int, choices=(0, 1), default=0, help="which replica's half of the trace")
    p.add_argument("--seconds", type=float, default=60.0, help="the trace's arrivals up to this time")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)

    import torch

    torch.set_num_threads(1)
    import dspark.draft_gate as draft_gate
    from bench import sim_validate
    from dspark import SamplingParams
    from dspark.config import EngineConfig
    from dspark.engine import Engine
    from sim.workload import generate

    rounds: list[dict] = []
    record = draft_gate.DraftGate.record

    def logged(gate, drafted, num_requests, accepted, verified, draft_seconds, sps=None):
        interval = gate.probe_every
        record(gate, drafted, num_requests, accepted, verified, draft_seconds, sps)
        if drafted:
            state = {k: round(v, 5) if isinstance(v, float) else v for k, v in gate.to_dict().items()}
            pays = gate.pays(num_requests, sps) if gate.draft_s is not None and sps and num_requests else None
            rounds.append(
                {
                    "requests": num_requests,
                    "accepted": accepted,
                    "verified": verified,
                    "draft_ms": round(draft_seconds * 1e3, 3),
                    "probe_interval": interval,
                    **state,
                    "pays": pays,
                }
            )

    draft_gate.DraftGate.record = logged
    target = args.models / "target"
    trace = generate(sim_validate.workload())
    prompts = sim_validate._prompts(target, trace)
    mine = [
        (r, q)
        for i, (r, q) in enumerate(zip(trace, prompts))
        if i % 2 == args.part and r.arrival < args.seconds
    ]
    engine = Engine(EngineConfig(model=str(target), **sim_validate.ENGINE))
    start, sent = time.perf_counter(), 0
    while sent < len(mine) or engine.has_unfinished():
        now = time.perf_counter() - start
        while sent < len(mine) and mine[sent][0].arrival <= now:
            req, prompt = mine[sent]
            params = SamplingParams(temperature=1.0, max_tokens=req.max_tokens, ignore_eos=True, seed=sent)
            engine.add_request(prompt, params)
            sent += 1
        if engine.has_unfinished():
            engine.step()
        else:
            time.sleep(0.001)
    stats, table = engine.stats, engine.cost_table
    print(f"requests {len(mine)}, steps {stats.steps}, gated {stats.gated_rounds}, drafted in {len(rounds)}")
    print("healed table, ms per forward:", [(b, round(1e3 / table(b), 2)) for b in (1, 2, 4, 8, 12, 16)])
    print(
        "probe interval at drafting rounds:",
        sorted(collections.Counter(r["probe_interval"] for r in rounds).items()),
    )
    print("drafting pays by the gate after a round:", dict(collections.Counter(r["pays"] for r in rounds)))
    if args.out:
        args.out.write_text("".join(json.dumps(r) + "\n" for r in rounds))


if __name__ == "__main__":
    main()
