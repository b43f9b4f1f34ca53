"""The draft gate's inputs and decisions on the simulator validation's trace, one engine outside Ray.

bench/sim_validate.py's real half serves its seeded trace on two replicas; this feeds one engine (the
same engine settings, one torch thread) the requests of one of them (every other request, `--part`),
each at its arrival time, and logs every round that drafted: the decoding requests, accepted and
verified drafts, the drafting seconds, the probe interval before it, the gate's state after it
(DraftGate.to_dict, as `state`) and whether drafting pays by that state. Run two at once (`--part 0` and
`--part 1`) for the validation's two engines on this machine's two cores.

    python bench/gate_trace.py --models models --part 0 --seconds 60 &
    python bench/gate_trace.py --models models --part 1 --seconds 60

--sim runs the same requests on one simulated replica of the measured CPU profile instead (sim/replica.py,
the engine's own gate and tables; its core to itself, as each of the two engines here nearly has): the
same summary, for the simulated gate beside the real one.

    python bench/gate_trace.py --models models --part 0 --seconds 120 --sim

Prints a summary (steps, the steps the gate declined, the rounds that drafted, the healed table, the
probe intervals, how often drafting paid by the gate's state); --out FILE also writes the rounds there as
JSON lines.
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
    p.add_argument(
        "--sim", action="store_true", help="a simulated engine of the measured CPU profile instead"
    )
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)

    import dspark.draft_gate as draft_gate
    from bench import sim_validate
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
                    "state": state,
                    "pays": None if pays is None else bool(pays),
                }
            )

    declined = collections.Counter()
    should_draft = draft_gate.DraftGate.should_draft

    def counted(gate, num_requests, sps):
        drafting = should_draft(gate, num_requests, sps)
        declined[not drafting] += 1
        return drafting

    draft_gate.DraftGate.record = logged
    draft_gate.DraftGate.should_draft = counted
    target = args.models / "target"
    trace = generate(sim_validate.workload())
    prompts = sim_validate._prompts(target, trace)
    mine = [
        (r, q)
        for i, (r, q) in enumerate(zip(trace, prompts))
        if i % 2 == args.part and r.arrival < args.seconds
    ]
    steps, table = (_simulated if args.sim else _served)(target, mine)
    print(f"requests {len(mine)}, steps {steps}, gated {declined[True]}, drafted in {len(rounds)}")
    print("healed table, ms per forward:", [(b, round(1e3 / table(b), 2)) for b in (1, 2, 4, 8, 12, 16)])
    print(
        "probe interval at drafting rounds:",
        sorted(collections.Counter(r["probe_interval"] for r in rounds).items()),
    )
    print("drafting pays by the gate after a round:", dict(collections.Counter(r["pays"] for r in rounds)))
    if args.out:
        args.out.write_text("".join(json.dumps(r) + "\n" for r in rounds))


def _served(target: Path, mine: list) -> tuple[int, object]:
    """The requests fed to one engine (the validation's settings, one torch thread) at their arrival
    times; returns its steps and its healed cost table."""
    import torch

    torch.set_num_threads(1)
    from bench import sim_validate
    from dspark import SamplingParams
    from dspark.config import EngineConfig
    from dspark.engine import Engine

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
    return engine.stats.steps, engine.cost_table


def _simulated(target: Path, mine: list) -> tuple[int, object]:
    """The same requests on one simulated replica of the measured CPU profile over the engines' cached SPS
    table, as bench/sim_validate.py runs its two, with its core to itself (no host block: the served
    engine here runs outside Ray, beside the other part's)."""
    from bench import sim_validate
    from sim.profiles import load

    trace = [r for r, _ in mine]
    _, (replica,) = sim_validate._run_sim(
        trace, sim_validate._engine_table(), load("cpu_measured"), "none", 1
    )
    return replica.counters.steps, replica.table


if __name__ == "__main__":
    main()
