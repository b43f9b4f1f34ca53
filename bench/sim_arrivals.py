"""The simulator on bench/serving_cost.py's open-loop runs: the same requests, real beside simulated.

serving_cost's measurement (bench/results/serving_cost.json) records every request of its open-loop runs
(Poisson arrivals at 2 and 4 per second for 40 s, its held-out prompts of 48 tokens in turn, 48 tokens
each): when it was sent, its first token and its end at the client, and its replica's way in, queue and
prefill. This runs the same requests (send times, the prompts' token ids for the prefix caches, their
lengths) on two simulated replicas of the profile derived from that measurement
(sim/profiles/cpu_measured.json, over the SPS table the served replicas used; bench/sim_validate.py
_run_sim) and sets side by side, per run: TTFT and TPOT p50 / p90 / p99, TTFT's parts (way in, queue,
prefill) and the engines' steps (steps, mean step wall, tokens and decoding requests per step, the
stretch of their steps on the host, drafted and accepted tokens); request by request, each side's TPOT by
the requests decoding beside it, on both replicas and, where the measurement named each request's
replica, on its own (how unevenly the requests piled up on one replica).

Not a validation on unseen work: the profile's serving-path remainder (path_in_beyond, path_back_beyond)
was measured on these very runs (bench/cost_profile.py open_loop_beyond) and its step terms on the same
measurement's closed-loop sweep. What it shows is the engine side at two loads: where the simulated
engines' steps part from the real ones' as the load grows (the validation, bench/sim_validate.py, runs
at one).

    python bench/sim_arrivals.py [--models models] [--measurement M] [--profile P]
                                 [--out bench/results/sim_arrivals.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from anywhere

from bench.cost_profile import arrival_rows  # noqa: E402
from bench.sim_validate import PROFILE, _engine_table, _run_sim  # noqa: E402
from sim.profiles import load  # noqa: E402
from sim.workload import Request  # noqa: E402

MEASUREMENT = REPO / "bench" / "results" / "serving_cost.json"
QUANTILES = (50, 90, 99)


def quantiles(values: Sequence[float]) -> dict[str, float | None]:
    """p50 / p90 / p99 in milliseconds (None for no values)."""
    return {
        f"p{q}_ms": round(float(np.percentile(values, q)) * 1e3, 2) if values else None for q in QUANTILES
    }


def trace_of(run: dict, prompts: Sequence[tuple[int, ...]], domains: Sequence[str], max_tokens: int):
    """An open-loop run's requests (serving_cost arrival_runs entry) as a simulator trace: each at its send
    time, with the prompt it was sent (the run's prompts in turn, as bench/serving_cost.py's
    _drive_arrivals deals them) and its max_tokens (ignore_eos: each ran to it)."""
    rows = arrival_rows(run)
    trace = [
        Request(
            rid=i,
            arrival=row["sent_s"],
            prompt_tokens=len(prompts[i % len(prompts)]),
            max_tokens=max_tokens,
            sla_class="standard",
            domain=domains[i % len(domains)],
            prompt_ids=prompts[i % len(prompts)],
        )
        for i, row in enumerate(rows)
    ]
    return sorted(trace, key=lambda r: r.arrival), rows


def real_side(rows: list[dict], max_tokens: int) -> dict:
    """The run's requests as the client and their replicas saw them."""
    timed = [r for r in rows if r["inbound_s"] is not None]
    return {
        "ttft": quantiles([r["first_token_s"] - r["sent_s"] for r in rows]),
        "tpot": quantiles([(r["end_s"] - r["first_token_s"]) / (max_tokens - 1) for r in rows]),
        "inbound": quantiles([r["inbound_s"] for r in timed]),
        "queue": quantiles([r["queue_s"] for r in timed]),
        "prefill": quantiles([r["prefill_s"] for r in timed]),
    }


def sim_side(requests: list[Request]) -> dict:
    """The simulated requests, in the same terms (their way in: arrival to admitted at the replica)."""
    done = [r for r in requests if r.outcome == "done"]
    parts = [r.ttft_parts for r in done if r.ttft_parts is not None]
    return {
        "ttft": quantiles([r.ttft for r in done]),
        "tpot": quantiles([r.tpot for r in done if r.generated > 1]),
        "inbound": quantiles([r.admitted - r.arrival for r in done]),
        "queue": quantiles([p[1] for p in parts]),
        "prefill": quantiles([p[2] for p in parts]),
        "unfinished": len(requests) - len(done),
    }


def steps_view(steps: float, step_s: float, cpu_s: float, tokens: float, rounds: float, drafted, accepted):
    return {
        "steps": int(steps),
        "mean_step_ms": round(step_s / steps * 1e3, 2),
        "tokens_per_step": round(tokens / steps, 2),
        "requests_per_step": round(rounds / steps, 2),
        "stretch": round(step_s / cpu_s, 3),
        "drafted_tokens": int(drafted),
        "accepted_tokens": int(accepted),
    }


def real_steps(counters: dict) -> dict:
    """The engines' counters over the run (their CPU: the steps' time on a CPU)."""
    keys = ("steps", "step_time_s", "engine_cpu_s", "forward_tokens", "rounds", "drafted_tokens")
    return steps_view(*(counters[k] for k in keys), counters["accepted_tokens"])


def sim_steps(replicas: list) -> dict:
    """The simulated replicas' counters summed (their CPU: the steps' time alone)."""
    keys = ("steps", "step_time_s", "alone_time_s", "forward_tokens", "rounds", "drafted_tokens")
    keys += ("accepted_tokens",)
    return steps_view(*(sum(getattr(r.counters, k) for r in replicas) for k in keys))


def compare_runs(
    measurement: dict,
    prompts: Sequence[tuple[int, ...]],
    domains: Sequence[str],
    profile_path: Path = PROFILE,
) -> dict:
    """Every open-loop run of the measurement, real beside simulated (on the committed profile, or the
    one derived from the measurement where that is elsewhere)."""
    serving = measurement["serving"]
    table = _engine_table((serving.get("sps_table") or {}).get("path"))
    profile = load(profile_path)
    out = {}
    for label, run in (serving.get("arrival_runs") or {}).items():
        trace, rows = trace_of(run, prompts, domains, serving["max_tokens"])
        # The measurement's closed-loop runs sent the same prompts to the same replicas before these runs
        # (their forward tokens show it: about a page a request, the rest cached): the simulated
        # replicas start with them cached too.
        requests, replicas = _run_sim(trace, table, profile, warm=list(prompts))
        out[label] = {
            "rate": run["rate"],
            "requests": len(rows),
            "real": {
                **real_side(rows, serving["max_tokens"]),
                "engines": real_steps(serving["engine_steps"][label]),
            },
            "sim": {**sim_side(requests), "engines": sim_steps(replicas)},
            "paired": paired(rows, requests, serving["max_tokens"]),
        }
    return out


def paired(rows: list[dict], requests: list[Request], max_tokens: int) -> dict:
    """Request by request (the i-th sent is rid i on both sides): how the real TPOT stands to the
    simulated one (their correlation; the real over the simulated at p10 / p50 / p90) and whether the
    ratio grows with the requests decoding beside each (its correlation with each request's mean count of
    requests between their first token and their end, itself included, at ten instants of its own
    decode), counted on the simulated side and on the real one. The simulated count is the simulator's
    own concurrency: a ratio that grows with it is concurrency the simulator underprices. The real count
    also grows wherever the real requests ran slow for any reason (slow requests overlap more)."""
    by_rid = {r.rid: r for r in requests}
    pairs = [
        (row, by_rid[i])
        for i, row in enumerate(rows)
        if by_rid[i].outcome == "done"
        and by_rid[i].tpot
        and row["end_s"] is not None
        and row["first_token_s"] is not None
        and _tokens(row, max_tokens) > 1
    ]
    if len(pairs) < 3:
        return {}
    real = np.array(
        [(row["end_s"] - row["first_token_s"]) / (_tokens(row, max_tokens) - 1) for row, _ in pairs]
    )
    sim = np.array([req.tpot for _, req in pairs])
    ratio = real / sim
    real_spans = [(row["first_token_s"], row["end_s"]) for row, _ in pairs]
    sim_spans = [(req.first_token, req.finish) for _, req in pairs]
    real_beside, sim_beside = decoding_beside(real_spans), decoding_beside(sim_spans)
    out = {
        "tpot_correlation": _correlation(real, sim),
        "tpot_real_over_sim": [round(float(v), 3) for v in np.percentile(ratio, (10, 50, 90))],
        "ratio_vs_decoding_beside_sim": _correlation(ratio, sim_beside),
        "ratio_vs_decoding_beside_real": _correlation(ratio, real_beside),
        # Each side's TPOT by its own concurrency: the price of a request beside (the rows' TPOT) apart
        # from how much concurrency each side makes (the rows' counts).
        "by_concurrency": {
            "real": by_concurrency(1e3 * real, real_beside),
            "sim": by_concurrency(1e3 * sim, sim_beside),
        },
    }
    # Over the run, window by window of arrivals: how each side's mean TPOT follows the trace's load.
    out["by_window"] = load_response(np.array([row["sent_s"] for row, _ in pairs]), real, sim)
    real_replicas = [row.get("replica") for row, _ in pairs]
    if None not in real_replicas:  # the measurement named each request's replica
        sim_replicas = [req.replica for _, req in pairs]
        real_own, sim_own = (
            decoding_beside(spans, replicas)
            for spans, replicas in ((real_spans, real_replicas), (sim_spans, sim_replicas))
        )
        out["on_own_replica"] = {
            side: {
                "mean_beside": round(float(own.mean()), 3),
                # Of the requests decoding beside each (itself included), the share on its own replica:
                # 1 / replicas where the router spreads them evenly, more where they pile up.
                "share_on_own": round(float((own / beside).mean()), 3),
                "by_concurrency": by_concurrency(1e3 * tpot, own, OWN_REPLICA_BINS),
                # The requests alone on their replica by the company on the other replicas: what the
                # engines beside theirs cost them, the batch itself left out.
                "alone_by_others": by_concurrency(
                    1e3 * tpot[own < ALONE], (beside - own)[own < ALONE], OTHERS_BINS
                ),
            }
            for side, tpot, own, beside in (
                ("real", real, real_own, real_beside),
                ("sim", sim, sim_own, sim_beside),
            )
        }
    return out


def _tokens(row: dict, max_tokens: int | None) -> int:
    """The tokens a real request generated: its row's where it keeps them (the validation's trace, its
    lengths drawn), else the run's max_tokens (the open-loop runs: every request ran to it)."""
    return row["generated"] if row.get("generated") is not None else max_tokens


# Bins of a request's concurrency (requests decoding beside it, itself included, both replicas together),
# and of the same on its own replica only.
CONCURRENCY_BINS = (1.0, 2.0, 3.0, 4.0, 6.0, 8.0)
OWN_REPLICA_BINS = (1.0, 1.5, 2.0, 2.5, 3.0, 4.0)
# A request is alone on its replica below ALONE requests decoding there on average (itself included); the
# company on the others then bins by OTHERS_BINS (none, about half its decode, about one, more).
ALONE = 1.05
OTHERS_BINS = (0.25, 0.75, 1.25)


def by_concurrency(
    tpot_ms: np.ndarray, beside: np.ndarray, bins: Sequence[float] = CONCURRENCY_BINS
) -> list[dict]:
    """Requests and their mean TPOT (ms) per bin of concurrency: below the first edge, between each two,
    from the last on."""
    edges = (0.0, *bins, float("inf"))
    rows = []
    for lo, hi in zip(edges, edges[1:]):
        inside = (beside >= lo) & (beside < hi)
        mean = round(float(tpot_ms[inside].mean()), 2) if inside.any() else None
        rows.append({"from": lo, "below": hi, "requests": int(inside.sum()), "tpot_ms": mean})
    return rows


def decoding_beside(spans: list[tuple[float, float]], replicas: Sequence | None = None) -> np.ndarray:
    """Each span's mean count of spans open at ten instants of its own (itself included); with each
    span's replica (`replicas`), only those on its own replica."""
    on = replicas if replicas is not None else [None] * len(spans)
    return np.array(
        [
            np.mean(
                [
                    sum(a <= t < b for (a, b), r in zip(spans, on) if r == mine)
                    for t in np.linspace(first, end, 10, endpoint=False)
                ]
            )
            for (first, end), mine in zip(spans, on)
        ]
    )


WINDOW_S = 10.0  # load_response's windows of arrivals


def load_response(sent: np.ndarray, real: np.ndarray, sim: np.ndarray, width_s: float = WINDOW_S) -> dict:
    """Each side's mean TPOT over the requests sent in each window of `width_s` (ms; windows with fewer
    than 5 requests left out), their correlation, and the real means' least-squares slope on the
    simulated ones: above 1, the real TPOT rises and falls with the trace's load more than the
    simulated one does."""
    windows = []
    for start in np.arange(0.0, float(sent.max()) + width_s, width_s):
        inside = (sent >= start) & (sent < start + width_s)
        if inside.sum() >= 5:
            windows.append((float(start), 1e3 * real[inside].mean(), 1e3 * sim[inside].mean()))
    if len(windows) < 3:
        return {}
    _, real_ms, sim_ms = (np.array(x) for x in zip(*windows))
    slope = float(np.polyfit(sim_ms, real_ms, 1)[0]) if sim_ms.std() > 0 else None
    return {
        "width_s": width_s,
        "from_s": [w[0] for w in windows],
        "real_ms": [round(float(x), 2) for x in real_ms],
        "sim_ms": [round(float(x), 2) for x in sim_ms],
        "correlation": _correlation(real_ms, sim_ms),
        "slope_real_on_sim": None if slope is None else round(slope, 3),
    }


def _correlation(a: np.ndarray, b: np.ndarray) -> float | None:
    """Pearson's r, None where either side does not vary."""
    if a.std() == 0 or b.std() == 0:
        return None
    return round(float(np.corrcoef(a, b)[0, 1]), 3)


def prompts_of(models: Path, requests: int, length: int) -> tuple[list[tuple[int, ...]], list[str]]:
    """bench/serving_cost.py's prompts (its `requests` held-out prompts of `length` tokens, code then
    prose) as the engine tokenizes them, and their domains."""
    from transformers import AutoTokenizer

    from drafter_service.demo.corpus import heldout_prompts

    tokenizer = AutoTokenizer.from_pretrained(models / "target")
    half = requests // 2
    texts = heldout_prompts("code", requests - half, length, tokenizer)
    texts += heldout_prompts("prose", half, length, tokenizer)
    ids = [tuple(tokenizer.encode(t, add_special_tokens=False)) for t in texts]
    return ids, ["code"] * (requests - half) + ["prose"] * half


def markdown(result: dict) -> str:
    lines = [
        f"Open-loop runs of {result['measurement']}, real beside simulated (`{result['command']}`), ms:",
        "",
        "| run | side | TTFT p50 / p90 / p99 | TPOT p50 / p90 / p99 | way in p50 / p99 | queue p50 / p99 "
        "| prefill p50 / p99 | steps | mean step | tokens / step | stretch | drafted |",
        "|---|---|---|---|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for label, run in result["runs"].items():
        for side in ("real", "sim"):
            s, e = run[side], run[side]["engines"]

            def q(part: str, keys: tuple = ("p50_ms", "p90_ms", "p99_ms"), s: dict = s) -> str:
                return " / ".join(f"{s[part][k]:.1f}" for k in keys)

            two = ("p50_ms", "p99_ms")
            lines.append(
                f"| {label} | {side} | {q('ttft')} | {q('tpot')} | {q('inbound', two)} | {q('queue', two)} "
                f"| {q('prefill', two)} | {e['steps']} | {e['mean_step_ms']} | {e['tokens_per_step']} "
                f"| {e['stretch']} | {e['drafted_tokens']} |"
            )
    lines += [
        "",
        "Request by request (bench/sim_arrivals.py paired): TPOT real over simulated, p10 / p50 / p90:",
    ]
    for label, run in result["runs"].items():
        p = run.get("paired") or {}
        if p:
            lines.append(
                f"- {label}: {' / '.join(str(v) for v in p['tpot_real_over_sim'])} (correlation "
                f"{p['tpot_correlation']}; the ratio's correlation with the requests decoding beside each, "
                f"counted in the simulator {p['ratio_vs_decoding_beside_sim']}, in the real run "
                f"{p['ratio_vs_decoding_beside_real']})"
            )
    for label, run in result["runs"].items():
        table = (run.get("paired") or {}).get("by_concurrency")
        if not table:
            continue
        lines += _concurrency_table(
            f"{label}: TPOT (ms) and requests by the requests decoding beside each (both replicas, itself "
            "included), each side by its own count:",
            table,
        )
        own = run["paired"].get("on_own_replica")
        if not own:
            continue
        lines += _concurrency_table(
            f"{label}: the same on each request's own replica (the measurement named it). Requests decoding "
            f"beside each on its replica, mean: real {own['real']['mean_beside']}, sim "
            f"{own['sim']['mean_beside']}; their share of those on both: real {own['real']['share_on_own']}, "
            f"sim {own['sim']['share_on_own']}.",
            {side: own[side]["by_concurrency"] for side in ("real", "sim")},
        )
        lines += _concurrency_table(
            f"{label}: the requests alone on their replica (fewer than {ALONE:g} decoding there, itself "
            "included), TPOT (ms) by the requests decoding on the other replicas meanwhile:",
            {side: own[side]["alone_by_others"] for side in ("real", "sim")},
        )
    return "\n".join(lines) + "\n"


def _concurrency_table(caption: str, table: dict) -> list[str]:
    """A captioned table of each side's TPOT and requests per bin (by_concurrency's rows)."""
    edges = [f"{r['from']:g}-{r['below']:g}" for r in table["real"]]
    header = ["", caption, "", "| side | " + " | ".join(edges) + " |", "|---|" + "---:|" * len(edges)]
    return header + _concurrency_rows(table)


def _concurrency_rows(table: dict) -> list[str]:
    rows = []
    for side in ("real", "sim"):
        cells = [
            "-" if r["tpot_ms"] is None else f"{r['tpot_ms']:.1f} ({r['requests']})" for r in table[side]
        ]
        rows.append(f"| {side} | " + " | ".join(cells) + " |")
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", type=Path, default=REPO / "models")
    p.add_argument("--measurement", type=Path, default=MEASUREMENT)
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "sim_arrivals.json")
    p.add_argument(
        "--profile",
        type=Path,
        default=PROFILE,
        help="the profile derived from the measurement (bench/sim_validate.py --measure-profile --out's)",
    )
    args = p.parse_args(argv)
    measurement = json.loads(args.measurement.read_text())
    serving = measurement["serving"]
    if not serving.get("arrival_runs"):
        raise SystemExit(f"{args.measurement} has no open-loop runs (bench/serving_cost.py --arrivals)")
    prompts, domains = prompts_of(args.models, serving["requests"], 48)
    command = "python bench/sim_arrivals.py " + " ".join(argv if argv is not None else sys.argv[1:])
    result = {
        "command": command.strip(),
        "measurement": f"{args.measurement.name} ({measurement.get('command')}, "
        f"{measurement.get('measured_at')})",
        "runs": compare_runs(measurement, prompts, domains, args.profile),
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))
    print("wrote", args.out, args.out.with_suffix(".md"))


if __name__ == "__main__":
    main()
