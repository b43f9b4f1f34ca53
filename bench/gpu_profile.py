"""The simulator's profile of a replica measured on a GPU (bench/gpu_measure.py's JSON) -> sim/profiles/.

SPS(B) is the engine's own table as measured. The step terms are fitted (sim/step_fit.py) to the decode
sweeps, in wall time: on a GPU the engine's thread waits for the device, so a step's wall time, not its
CPU, is what a request waits. Only sweep points whose window held decode steps alone are used (a point
whose tokens per step exceed its requests' verify windows still had prefill chunks in it). Acceptance is
not measurable with random weights: it is the paper's, taken from the published profile named by
--acceptance-from. KV pages: what the device's memory holds at a 0.9 memory fraction after the
weights and the measured activation peak, at the measured bytes per token.

    python bench/gpu_profile.py bench/results/gpu_measurement_qwen3-4b.json \\
        --name gpu_h200_ours_qwen3_4b --out sim/profiles/gpu_h200_ours_qwen3_4b.json
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import replace
from pathlib import Path

from dspark.cost_table import CostTable
from sim import profiles
from sim.step_fit import EngineRun, fit_draft_terms, forward_s, model_s, nonnegative_least_squares

REPO = Path(__file__).resolve().parent.parent
MEMORY_FRACTION = 0.9  # vLLM's default gpu_memory_utilization


def decode_only(point: dict) -> bool:
    """Whether the point's window ran decode steps of all its requests and nothing else: every request
    had a round in every step, and no step ran more than their verify windows (anchor + drafts)."""
    steps, requests = point["steps"], point["concurrency"]
    window = 1 + point["drafted_tokens"] / max(1, point["rounds"])
    every_step = steps > 0 and point["rounds"] == steps * requests
    return every_step and point["forward_tokens"] <= steps * requests * window + 1e-9


def engine_run(point: dict) -> EngineRun:
    """A sweep point as the step fit reads a run, its wall time standing for the engine thread's time."""
    return EngineRun(
        steps=int(point["steps"]),
        forward_tokens=point["forward_tokens"],
        rounds=point["rounds"],
        cpu_s=point["step_time_s"],
        draft_cpu_s=point["draft_time_s"],
    )


STEP_TERMS = ("forward_scale", "step_overhead_s", "request_overhead_s", "token_overhead_s")


def fit_steps(runs: list[EngineRun], table: CostTable) -> tuple[dict[str, float], str]:
    """The step terms over the runs, and which fit gave them: all four where the runs vary the forward,
    requests and tokens independently; else the forward's scale and a per-step cost; else (the table
    flat over the runs' sizes, so the forward cannot be told from the rest) the forward as the table
    times it and the mean remainder per step."""
    x = [[forward_s(r, table), 1.0, r.requests_per_step, r.tokens_per_step] for r in runs]
    y = [r.plain_cpu_s / r.steps for r in runs]
    for size, how in ((4, "four terms"), (2, "forward scale and per-step cost")):
        try:
            terms = nonnegative_least_squares([row[:size] for row in x], y, "the step", required=(0,))
        except ValueError:
            continue
        return {**dict.fromkeys(STEP_TERMS, 0.0), **dict(zip(STEP_TERMS, terms))}, how
    step = max(0.0, sum(t - row[0] for t, row in zip(y, x)) / len(y))
    return {**dict.fromkeys(STEP_TERMS, 0.0), "forward_scale": 1.0, "step_overhead_s": step}, (
        "the table flat over the points: forward as profiled, per-step cost the mean remainder"
    )


def above_plain(run: EngineRun, table: CostTable, terms: dict[str, float]) -> EngineRun:
    """A drafting run whose drafting time is all its step time above the plain step model at its tokens
    and requests: the drafter's own time, and the verify step's host work that plain steps do not do
    (the simulator prices both in the drafter's terms, which apply to steps that draft)."""
    plain = run.steps * model_s(run, table, terms)
    return replace(run, draft_cpu_s=max(0.0, run.cpu_s - plain))


def kv_pages(measurement: dict, page_size: int) -> int:
    hw = measurement["hardware"]
    if "memory_bytes" not in hw:
        return int(measurement["settings"]["kv_pages"])
    allocated_kv = measurement["settings"]["kv_pages"] * page_size * measurement["kv_bytes_per_token"]
    # The measured peak held the weights, the KV cache the engine allocated and the activations.
    others = measurement.get("peak_memory_bytes_drafting", allocated_kv) - allocated_kv
    free = MEMORY_FRACTION * hw["memory_bytes"] - others
    return max(1, math.floor(free / (page_size * measurement["kv_bytes_per_token"])))


def derive(measurement: dict, acceptance_from: profiles.Profile, name: str, source: str) -> dict:
    """The profile (as its file's dict) of the measured replica."""
    settings, sps = measurement["settings"], measurement["sps_table"]
    table = CostTable(sps["points"], sps["rates"], sps["max_tokens"])
    plain = [p for p in measurement["engine_sweep"] if decode_only(p)]
    drafting = [p for p in measurement.get("draft_sweep", []) if decode_only(p)]
    terms, how = fit_steps([engine_run(p) for p in plain], table)
    draft_terms = fit_draft_terms([above_plain(engine_run(p), table, terms) for p in drafting])
    if len(drafting) < 2:
        draft_terms = {}
    page_size = sps["shape"]["page_size"]
    hw, shape = measurement["hardware"], measurement["shape"]
    used = lambda points: ", ".join(f"c={p['concurrency']}/p={p['prompt_tokens']}" for p in points)  # noqa: E731
    return {
        "name": name,
        "hardware": f"one {hw['device']}, torch {hw['torch']}: this project's engine (dspark/) serving a "
        f"{shape['name']}-shaped target in {settings['dtype']} with a DSpark drafter of the paper's shape",
        "sources": [
            f"{source}: {measurement['command']} (started {measurement['started']}); SPS(B) is the engine's "
            f"own profile ({len(sps['points'])} points, max B {sps['max_tokens']}, context "
            f"{sps['shape']['context_len']} tokens, profiled in {sps['profile_s']:.0f} s)",
            f"step terms ({how}): non-negative least squares (sim/step_fit.py) of each step's wall time on "
            f"the plain decode sweep points that ran decode steps only ({used(plain)})",
            f"drafter terms: the same on the drafting sweep (fixed block {settings['gamma']}, gate off; "
            f"{used(drafting)}) of each step's wall time above the plain step model at its tokens: the "
            "drafter's own time and the verify step's extra host work"
            if draft_terms
            else "drafter terms: none measured (no clean drafting sweep point)",
            f"acceptance: {acceptance_from.name}'s per-position rows (the DSpark paper's Qwen3-4B figures)",
        ],
        "assumptions": [
            "random weights: a step's time depends on shapes, not on values; acceptance is not measurable "
            "so is taken from the paper; confidences calibrated",
            "a step's wall time stands for what a request waits: the engine thread waits for the device",
            f"KV cache: what {MEMORY_FRACTION:.0%} of the device's memory holds after the weights and the "
            "measured activation peak",
            "no serving-path cost and no host block (as gpu_dsv4flash_rocm: the serving path runs on the "
            "node's other cores)",
        ],
        "sps": {"points": sps["points"], "rates": [round(r, 6) for r in sps["rates"]]},
        "max_num_batched_tokens": int(sps["max_tokens"]),
        "max_num_seqs": int(settings["max_num_seqs"]),
        "kv_pages": kv_pages(measurement, page_size),
        "page_size": page_size,
        "gamma": int(settings["gamma"]),
        **{k: round(v, 9) for k, v in terms.items()},
        **{k: round(v, 9) for k, v in draft_terms.items()},
        "acceptance": {d: list(row) for d, row in acceptance_from.acceptance.items()},
        "request_path_s": 0.0,
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("measurement", type=Path)
    p.add_argument("--name", required=True)
    p.add_argument("--acceptance-from", default="gpu_dsv4flash_rocm")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    measurement = json.loads(args.measurement.read_text())
    out = derive(measurement, profiles.load(args.acceptance_from), args.name, str(args.measurement))
    profiles.from_dict(out)  # refuse to write what the simulator could not load
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(
        json.dumps({k: v for k, v in out.items() if k.endswith("_s") or k in ("forward_scale", "kv_pages")})
    )


if __name__ == "__main__":
    main()
