"""Do some requests draft much better than others? Acceptance per request on the validation's prompts.

The simulator draws every request's drafts from its domain's one acceptance row (sim/profiles.py). That
is right only if requests of a domain do not differ in acceptance beyond chance, and if a round's outcome
does not predict the next one's. This serves the simulator validation's prompts (bench/sim_validate.py,
the first --requests of its trace, at temperature 1 as the validation samples) on one engine with the
draft gate off, four requests at a time, and records every round's verified and accepted drafts per
request (Engine.round_observers). Per domain it sets the spread of the requests' acceptance rates
(accepted over verified drafts) beside the same rounds dealt to the same requests at random (a
permutation null: every request drawing from one distribution of rounds), and the correlation of a
request's accepted drafts in one round with the next.

    python bench/accept_spread.py --models models [--requests 64]

Writes bench/results/accept_spread.json.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from anywhere

Round = tuple[int, int]  # (drafts verified, drafts accepted)


def acceptance_rates(requests: Sequence[Sequence[Round]]) -> list[float]:
    """Each request's accepted over verified drafts (those that verified any)."""
    rates = []
    for rounds in requests:
        verified = sum(k for k, _ in rounds)
        if verified:
            rates.append(sum(a for _, a in rounds) / verified)
    return rates


def rate_spread(requests: Sequence[Sequence[Round]]) -> float:
    """The standard deviation of the requests' acceptance rates."""
    rates = acceptance_rates(requests)
    return statistics.pstdev(rates) if len(rates) > 1 else 0.0


def permutation_spread(requests: Sequence[Sequence[Round]], draws: int, seed: int = 0) -> list[float]:
    """rate_spread of the same rounds dealt at random to requests of the same sizes, `draws` times,
    ascending: what the spread is when every request draws from one distribution."""
    rng = random.Random(seed)
    pool = [r for rounds in requests for r in rounds]
    out = []
    for _ in range(draws):
        rng.shuffle(pool)
        dealt, start = [], 0
        for rounds in requests:
            dealt.append(pool[start : start + len(rounds)])
            start += len(rounds)
        out.append(rate_spread(dealt))
    return sorted(out)


def lag_correlation(requests: Sequence[Sequence[Round]]) -> float | None:
    """Correlation of a request's accepted drafts in a round with its next round's (None: too few)."""
    pairs = [(rounds[j][1], rounds[j + 1][1]) for rounds in requests for j in range(len(rounds) - 1)]
    if len(pairs) < 3:
        return None
    xs, ys = zip(*pairs)
    if len(set(xs)) < 2 or len(set(ys)) < 2:
        return None
    return statistics.correlation(xs, ys)


def summarize(requests: Sequence[Sequence[Round]], draws: int = 200) -> dict:
    """One domain's figures: requests, rounds, acceptance rate, the spread against its permutation null
    (median and 95th percentile), the lag-1 correlation, the requests' lowest and highest rate."""
    rounds = [r for rs in requests for r in rs]
    verified = sum(k for k, _ in rounds)
    null = permutation_spread(requests, draws)
    rates = acceptance_rates(requests)
    corr = lag_correlation(requests)
    return {
        "requests": len(requests),
        "rounds": len(rounds),
        "accept_rate": round(sum(a for _, a in rounds) / verified, 4) if verified else None,
        "rate_sd": round(rate_spread(requests), 4),
        "rate_sd_null_p50": round(null[len(null) // 2], 4),
        "rate_sd_null_p95": round(null[int(0.95 * len(null))], 4),
        "lag1_correlation": None if corr is None else round(corr, 4),
        "rate_min": round(min(rates), 4) if rates else None,
        "rate_max": round(max(rates), 4) if rates else None,
    }


def measure(models: Path, count: int) -> dict[str, list[list[Round]]]:
    """Every round's (verified, accepted) per request of the validation trace's first `count`, by domain."""
    import torch

    torch.set_num_threads(1)
    from bench import sim_validate
    from dspark import SamplingParams
    from dspark.config import EngineConfig
    from dspark.engine import Engine
    from sim.workload import generate

    target = models / "target"
    trace = generate(sim_validate.workload())
    prompts = sim_validate._prompts(target, trace)
    engine = Engine(EngineConfig(model=str(target), **{**sim_validate.ENGINE, "draft_gate": False}))
    rounds: dict[str, list[Round]] = {}
    engine.round_observers.append(
        lambda seq, proposal, n, verdict: rounds.setdefault(seq.request_id, []).append(
            (n, verdict.num_accepted)
        )
    )
    todo, domain = list(zip(trace, prompts))[:count], {}
    sent = 0
    while sent < len(todo) or engine.has_unfinished():
        while sent < len(todo) and len(engine.seqs) < 4:
            req, prompt = todo[sent]
            params = SamplingParams(temperature=1.0, max_tokens=req.max_tokens, ignore_eos=True, seed=sent)
            domain[engine.add_request(prompt, params)] = req.domain
            sent += 1
        engine.step()
    by_domain: dict[str, list[list[Round]]] = {}
    for rid, rs in rounds.items():
        by_domain.setdefault(domain[rid], []).append(rs)
    return by_domain


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", type=Path, default=REPO / "models")
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "accept_spread.json")
    args = p.parse_args(argv)
    started = time.time()
    by_domain = measure(args.models, args.requests)
    result = {
        "command": "python bench/accept_spread.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "domains": {d: summarize(rs) for d, rs in sorted(by_domain.items())},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
