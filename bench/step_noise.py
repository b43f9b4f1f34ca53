"""How much one engine's steps vary on this machine with nothing else to vary them: one engine outside Ray,
the validation's engine settings at one torch thread, one request at a time.

The simulator prices a step from its batch alone (sim/profiles.py), so two requests that decode alike are
priced alike. On the real stack they are not: request by request the validation's real TPOT runs from
0.63 to 1.28 times the simulated one (bench/results/sim.md, "Request by request"), and the requests
alone on their replica already part by about 10 % (log sd) where the simulated ones part by 3 %. This
measures the part of that spread the machine makes by itself: the same work, step after step, timed.

Held-out prompts of the validation's two domains in turn (48 tokens), each run alone to 64 tokens
(ignore_eos), back to back for --seconds. Per decode step: its wall over the median decode step's
(the steps are alike: one request, one token each, the draft gate declining nearly every round); their
spread, how it persists from step to step (autocorrelation of the log ratio by lag, in steps and in ms at
the median step), and the spread of each request's mean step (what a lone request's TPOT sees). The
prompt steps are left out: the prompts repeat, so the engine's prefix cache makes them unlike. Writes OUT
(bench/results/step_noise.json) and its plot beside it.

    python bench/step_noise.py --models models [--seconds 30] [--out bench/results/step_noise.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from anywhere

LAGS = (1, 2, 5, 10, 20, 50, 100)  # steps
QUANTILES = (10, 50, 90, 99)
WINDOW = 30  # requests (about 6 s here)


def noise(requests: Sequence[dict]) -> dict:
    """The spread of step walls over `requests` (each {"decode": its decode steps' walls in order, the
    steps that drafted left out, "drafting_steps": how many}): decode steps over their median (quantiles;
    the log ratio's sd and its autocorrelation by lag across the whole run, requests back to back) and
    each request's mean decode step over their median (its log sd); the two spreads again over
    consecutive windows of WINDOW requests."""
    decode = [np.asarray(r["decode"], dtype=float) for r in requests if len(r["decode"]) > 1]
    steps = np.concatenate(decode)
    median = float(np.median(steps))
    log = np.log(steps / median)
    centred = log - log.mean()
    return {
        "requests": len(decode),
        "decode_steps": int(steps.size),
        "drafting_steps_left_out": int(sum(r["drafting_steps"] for r in requests)),
        "median_decode_step_ms": round(median * 1e3, 3),
        "decode_over_median": _quantiles(steps / median),
        **_spreads(decode),
        "autocorrelation": [
            {"lag_steps": lag, "lag_ms": round(lag * median * 1e3, 1), "r": _lagged(centred, lag)}
            for lag in LAGS
            if lag < steps.size - 2
        ],
        # Whether the machine's noise holds still over the run (it need not: a shared host's neighbours
        # come and go).
        "by_window": [
            {"requests": f"{i + 1}-{i + WINDOW}", **_spreads(decode[i : i + WINDOW])}
            for i in range(0, len(decode) - WINDOW + 1, WINDOW)
        ],
    }


def fit(noise: dict) -> dict:
    """The simulator's `step_noise` block (sim/noise.py) from a measurement's `noise`: the log ratio's
    autocorrelation r(lag) fitted as (1 - w) exp(-lag / correlation_s) by least squares on log r over the
    measured lags (the lags whose r is positive), and its variance (decode_log_sd squared) split into the
    slow part, 1 - w of it, and each step's own, w."""
    lags = [(a["lag_ms"] / 1e3, a["r"]) for a in noise["autocorrelation"] if a["r"] > 0]
    if len(lags) < 2:
        raise ValueError("need the autocorrelation at two lags at least to fit the wander's memory")
    slope, intercept = np.polyfit([lag for lag, _ in lags], [np.log(r) for _, r in lags], 1)
    if slope >= 0:
        raise ValueError(
            f"the autocorrelation does not fall with the lag (slope {slope:.3g}): no memory to fit"
        )
    kept = min(1.0, float(np.exp(intercept)))
    sd = float(noise["decode_log_sd"])
    return {
        "slow_log_sd": round(sd * kept**0.5, 4),
        "white_log_sd": round(sd * (1.0 - kept) ** 0.5, 4),
        "correlation_s": round(-1.0 / float(slope), 4),
    }


def _spreads(decode: list[np.ndarray]) -> dict[str, float]:
    """The log sd of the decode steps over their median, and of each request's mean step over theirs."""
    steps = np.concatenate(decode)
    means = np.array([d.mean() for d in decode])
    return {
        "decode_log_sd": round(float(np.log(steps / np.median(steps)).std()), 4),
        "request_mean_log_sd": round(float(np.log(means / np.median(means)).std()), 4),
    }


def _quantiles(values: np.ndarray) -> dict[str, float]:
    return {f"p{q}": round(float(np.percentile(values, q)), 3) for q in QUANTILES}


def _lagged(x: np.ndarray, lag: int) -> float:
    """The autocorrelation of `x` (centred) at `lag`."""
    return round(float(np.dot(x[:-lag], x[lag:]) / np.dot(x, x) * x.size / (x.size - lag)), 3)


def measure(models: Path, seconds: float) -> list[dict]:
    """Each request's steps (noise's input), one request at a time on one engine."""
    import torch

    torch.set_num_threads(1)
    from transformers import AutoTokenizer

    from bench.sim_validate import ENGINE
    from drafter_service.demo.corpus import heldout_prompts
    from dspark import SamplingParams
    from dspark.config import EngineConfig
    from dspark.engine import Engine

    target = models / "target"
    tokenizer = AutoTokenizer.from_pretrained(target)
    prompts = [
        tokenizer.decode(tokenizer.encode(p, add_special_tokens=False)[:48])
        for d in ("code", "prose")
        for p in heldout_prompts(d, 32, 256, tokenizer)
    ]
    engine = Engine(EngineConfig(model=str(target), **ENGINE))

    def one(i: int) -> dict:
        params = SamplingParams(temperature=1.0, max_tokens=64, ignore_eos=True, seed=i)
        engine.add_request(prompts[i % len(prompts)], params)
        walls, drafted, last = [], [], time.perf_counter()
        while engine.has_unfinished():
            before = engine.stats.drafted_tokens
            engine.step()
            now = time.perf_counter()
            walls.append(now - last)
            drafted.append(engine.stats.drafted_tokens > before)
            last = now
        # A step that drafted is another kind of step (the profile prices drafting apart): left out.
        decode = [w for w, d in zip(walls[1:], drafted[1:]) if not d]
        return {"decode": decode, "drafting_steps": sum(drafted[1:])}

    for i in range(3):  # warm: the first steps of a fresh engine are not the ones served
        one(i)
    out, start, i = [], time.perf_counter(), 3
    while time.perf_counter() - start < seconds:
        out.append(one(i))
        i += 1
        elapsed = time.perf_counter() - start
        print(f"\r{elapsed:5.1f} / {seconds:g} s, {len(out)} requests", end="", flush=True)
    print()
    return out


def plot(result: dict, path: Path) -> None:
    """The autocorrelation by lag, and the two spreads window by window."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = result["noise"]
    fig, (lags, windows) = plt.subplots(1, 2, figsize=(10, 3.5))
    lags.plot([a["lag_ms"] for a in n["autocorrelation"]], [a["r"] for a in n["autocorrelation"]], marker="o")
    lags.set_xscale("log")
    lags.axhline(0.0, color="grey", linewidth=0.5)
    lags.set_xlabel("lag (ms, at the median decode step)")
    lags.set_ylabel("autocorrelation of log(step / median)")
    lags.set_title(f"One engine alone: decode step log sd {n['decode_log_sd']}")
    for key, label in (("decode_log_sd", "decode steps"), ("request_mean_log_sd", "requests' mean step")):
        windows.plot([w[key] for w in n["by_window"]], marker="o", label=label)
    windows.set_xlabel(f"window of {WINDOW} requests, in order")
    windows.set_ylabel("log sd")
    windows.set_ylim(bottom=0)
    windows.legend()
    windows.set_title("The spread window by window")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", type=Path, default=REPO / "models")
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "step_noise.json")
    args = p.parse_args(argv)
    command = "python bench/step_noise.py " + " ".join(argv if argv is not None else sys.argv[1:])
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    requests = measure(args.models, args.seconds)
    result = {"command": command.strip(), "started": started, "noise": noise(requests)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    plot(result, args.out.with_suffix(".png"))
    print(json.dumps(result, indent=1))
    print("wrote", args.out, args.out.with_suffix(".png"))


if __name__ == "__main__":
    main()
