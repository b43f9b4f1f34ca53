"""The validation's comparison: real runs of one seeded trace against the simulator, beside the real runs'
own spread, as figures and as the report's tables.

Two real runs or more of identical work (a fresh stack each, the same requests at the same times) show how
far the real cluster moves on its own: a simulated figure is judged against their mean, and a difference
the size of the real runs' own is noise, not a fault of the model. The engines' steps over each run (their
counters) are set beside the simulated replicas' (sim/replica.Counters): where a latency parts, they say
whether the steps are slower, more stretched by the host, or differently composed. Pure: no I/O, no Ray.
"""

from __future__ import annotations

import json

METRICS = ("throughput_rps", "output_tok_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s")
LIMIT = 0.15  # the bound on |sim / real - 1|


def rel(real: float | None, other: float | None) -> float | None:
    """other / real - 1, to 4 places (None where either is missing or real is 0)."""
    return None if not real or other is None else round((other - real) / real, 4)


def compare(real_runs: list[dict], sims: dict[str, dict], seeded: list[dict] | None = None) -> dict:
    """Per metric: each real run's figure (`real_runs`), their mean (`real`, the reference), run 2 against
    run 1 (`real_vs_real`) and the largest run over the smallest (`real_spread`: the real cluster's own
    noise, with two runs or more), and each simulated variant's figure with its difference to the mean
    (`rel_diff` for "sim", `rel_diff_<label>` for the others) and to each run (`rel_diff_runs`, "sim"
    only). `seeded`: "sim"'s figures under several seeds (the first its own), when it ran under more
    than one: then "sim" is their mean (`sim_runs`, and their spread `sim_spread`, beside). Then the
    verdict on "sim": the largest difference, whether all are within 15 %, which are outside, and which
    part from the real mean by more than the real runs part from each other."""
    if seeded and len(seeded) > 1:
        sims = {**sims, "sim": mean_figures(seeded)}
    out: dict = {}
    for m in METRICS:
        values = [run[m] for run in real_runs]
        real = _mean(values)
        entry = {
            "real": real,
            "real_runs": values,
            "real_vs_real": rel(values[0], values[1]) if len(values) > 1 else None,
            # The runs' own spread, the largest over the smallest: run 2 against run 1 for two runs
            # (whichever is larger), the whole range for more.
            "real_spread": _spread(values),
        }
        for label, figures in sims.items():
            entry[label] = figures[m]
            entry["rel_diff" if label == "sim" else f"rel_diff_{label}"] = rel(real, figures[m])
        if "sim" in sims:
            entry["rel_diff_runs"] = [rel(v, sims["sim"][m]) for v in values]
        if seeded and len(seeded) > 1:
            runs = [run[m] for run in seeded]
            entry["sim_runs"] = runs
            entry["sim_spread"] = _spread(runs)
        out[m] = entry
    judged = _verdict(out)
    noisy = [m for m in judged if out[m]["real_spread"] is not None]
    out["beyond_real_noise"] = [m for m in noisy if abs(out[m]["rel_diff"]) > out[m]["real_spread"]]
    return out


def _verdict(out: dict) -> list[str]:
    """Into `out` (per metric, a "rel_diff" of the simulated figure to the real one): the largest
    difference, whether all are within 15 % and which are outside; returns the metrics judged (those
    with a difference)."""
    judged = [m for m in METRICS if out[m].get("rel_diff") is not None]
    out["max_abs_rel_diff"] = max((abs(out[m]["rel_diff"]) for m in judged), default=None)
    out["within_15pct"] = bool(judged) and out["max_abs_rel_diff"] <= LIMIT
    out["outside_15pct"] = [m for m in judged if abs(out[m]["rel_diff"]) > LIMIT]
    return judged


def mean_figures(runs: list[dict]) -> dict:
    """Each metric's mean over `runs` (a simulator's runs under several seeds)."""
    return {m: _mean([run[m] for run in runs]) for m in METRICS}


def machine_factor(counters: dict, sim_reading: float) -> dict | None:
    """How much slower than the profile's model a real run's machine did the same work: its stack's CPU
    (the engines' threads, their CPU over the profile's model read against the simulator's own reading
    of it, `sim_reading`, which is not 1: the model prices the mean step; and the serving path's busy
    cores over the run) over the profile's model of the same work. The engines' and the path's factors
    apart beside it. None where the run's counters lack either part."""
    needed = ("engine_cpu_s", "engine_model_s", "serving_load_cores", "serving_load_model_cores", "wall_s")
    if not counters or not sim_reading or any(counters.get(k) is None for k in needed):
        return None
    engine = counters["engine_cpu_s"] / sim_reading
    path = counters["serving_load_cores"] * counters["wall_s"]
    path_model = counters["serving_load_model_cores"] * counters["wall_s"]
    return {
        "stack": round((engine + path) / (counters["engine_model_s"] + path_model), 4),
        "engine": round(engine / counters["engine_model_s"], 4),
        "path": round(path / path_model, 4),
    }


def speed_matched(real_runs: list[dict], sim_runs: list[dict], factors: list[dict]) -> dict:
    """Each real run against the simulator on a machine as much slower than the profile as that run's
    was (`factors`, machine_factor; `sim_runs[i]` simulated at factors[i]["stack"]): per metric each
    pair's difference, and the mean of the simulated runs against the mean of the real ones, with the
    verdict on those means. The machine's speed is an input the profile cannot hold where it drifts from
    run to run; one factor per run, from its CPU accounting, never from its latencies."""
    out: dict = {"factors": factors}
    for m in METRICS:
        real, sim = [run[m] for run in real_runs], [run[m] for run in sim_runs]
        out[m] = {
            "real_runs": real,
            "sim_runs": sim,
            "rel_diff_runs": [rel(r, x) for r, x in zip(real, sim)],
            "real": _mean(real),
            "sim": _mean(sim),
            "rel_diff": rel(_mean(real), _mean(sim)),
        }
    judged = _verdict(out)
    out["runs_outside_15pct"] = {
        m: [i + 1 for i, d in enumerate(out[m]["rel_diff_runs"]) if d is not None and abs(d) > LIMIT]
        for m in judged
    }
    return out


def _mean(values: list[float | None]) -> float | None:
    return None if None in values else round(sum(values) / len(values), 6)


def _spread(values: list[float | None]) -> float | None:
    """The largest over the smallest, less 1 (None with fewer than two figures or one missing)."""
    return rel(min(values), max(values)) if len(values) > 1 and None not in values else None


def step_view(counters: dict) -> dict:
    """A run's engine steps per step: wall, CPU (the real engine thread's, or the model's time alone on a
    core), the host's stretch (wall over CPU), decoding requests, forward tokens and padded keys, and
    drafts per round; and, for a real run, the cores other work kept busy meanwhile."""
    steps = max(1, counters["steps"])
    cpu = counters["engine_cpu_s"] if "engine_cpu_s" in counters else counters["alone_time_s"]
    rounds = max(1, counters["rounds"])
    return {
        "steps": int(counters["steps"]),
        "step_ms": round(counters["step_time_s"] / steps * 1e3, 3),
        "cpu_ms": round(cpu / steps * 1e3, 3),
        "stretch": round(counters["step_time_s"] / cpu, 3) if cpu else None,
        "rounds_per_step": round(counters["rounds"] / steps, 3),
        "tokens_per_step": round(counters["forward_tokens"] / steps, 3),
        # The forward's padded key positions (requests x longest context), where both sides count them.
        "keys_per_step": round(counters["attention_keys"] / steps, 1)
        if counters.get("attention_keys")
        else None,
        "drafted_per_round": round(counters["drafted_tokens"] / rounds, 3),
        # CPU over the profile's model at the run's mean step (bench/serving_cost.engine_model_s): the
        # real runs' against the sim's own says how far the real engines are from the profile.
        "cpu_over_model": counters.get("engine_cpu_over_model"),
        # Busy cores beyond the stack's own: other work on the machine, which no profile knows about (a
        # real run with it measured a slower machine than the one the profile describes).
        "other_cores": round(counters["machine_busy_cores"] - counters["stack_cores"], 3)
        if "stack_cores" in counters
        else None,
    }


STEP_COLUMNS = (
    ("steps", "steps"),
    ("step_ms", "step wall ms"),
    ("cpu_ms", "CPU ms"),
    ("stretch", "wall / CPU"),
    ("rounds_per_step", "requests / step"),
    ("tokens_per_step", "tokens / step"),
    ("keys_per_step", "keys / step"),
    ("drafted_per_round", "drafts / request"),
    ("cpu_over_model", "CPU / model"),
    ("other_cores", "other work, cores"),
)


def validation_lines(validation: dict) -> list[str]:
    """The validation against the real cluster as tables: every metric for each real run, their spread,
    the simulator and its difference to the real mean and to each run; then the engines' steps."""
    if "real_measured" not in validation:  # skipped, or a run that did not finish
        return [f"Validation: `{json.dumps(validation)}`\n"]
    lines = [
        f"Validation against real Ray Serve (`{validation['command']}`; real half: "
        f"`{validation['real_measured']}`"
        + (f"; profile: `{validation['profile']['path']}`" if validation.get("profile") else "")
        + "):\n"
    ]
    runs = len(validation[METRICS[0]].get("real_runs") or [None])
    if runs == 1:  # one real run (results before the second run was added)
        lines += ["| metric | real | sim | sim vs real |", "|---|---:|---:|---:|"]
        for name in METRICS:
            m = validation[name]
            lines.append(f"| {name} | {m['real']} | {m['sim']} | {_pct(m['rel_diff'])} |")
    else:
        each = [f"real run {i + 1}" for i in range(runs)]
        versus = [f"sim vs run {i + 1}" for i in range(runs)]
        spread = "run 2 vs run 1" if runs == 2 else "runs' spread (max / min)"
        header = ["metric", *each, spread, "sim", "sim vs real (mean)", *versus]
        lines += ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
        for name in METRICS:
            m = validation[name]
            noise = m["real_vs_real"] if runs == 2 else m.get("real_spread")
            cells = [name, *map(str, m["real_runs"]), _pct(noise), str(m["sim"])]
            cells += [_pct(m["rel_diff"]), *map(_pct, m["rel_diff_runs"])]
            lines.append("| " + " | ".join(cells) + " |")
    seeds = validation.get("sim_seeds") or 1
    if seeds > 1:
        spreads = [
            f"{name} {_pct(validation[name].get('sim_spread'))}"
            for name in METRICS
            if validation[name].get("sim_runs")
        ]
        lines.append(
            f"\nsim: the mean of {seeds} runs under their own seeds; their spread (max / min): "
            + ", ".join(spreads)
        )
    outside = validation["outside_15pct"]
    verdict = f"outside 15 %: {', '.join(outside)}" if outside else "all within 15 %"
    if "beyond_real_noise" in validation and runs > 1:
        beyond = validation["beyond_real_noise"]
        verdict += "; sim parts from the real mean by more than the real runs part: " + (
            ", ".join(beyond) if beyond else "none"
        )
    lines.append(f"\n{verdict}\n")
    lines += speed_matched_lines(validation.get("speed_matched"))
    lines += paired_lines(validation.get("paired"))
    checked = (validation.get("profile") or {}).get("host_check")
    if checked:  # the host model on the profile measurement's own runs
        runs = [
            f"{k} {v['measured']} / {v['model']} ({v['model_with_other_work']}; {v['engines_stepping']})"
            for k, v in checked.items()
        ]
        lines.append(
            "Host model on the profile measurement's engine runs, stretch measured / modelled (modelled "
            "with the other work on the machine; the share of the run each engine stepped): "
            + "; ".join(runs)
            + "\n"
        )
        paths = [
            f"{k} {v['path_ms']} / {v['path_model_ms']} ({v['path_at_measured_stretch_ms']})"
            + (f", way in {v['path_in_ms']} / {v['path_in_model_ms']}" if "path_in_ms" in v else "")
            for k, v in checked.items()
            if "path_ms" in v
        ]
        if paths:  # the serving path under load: the premise of its stretch in the simulator
            idle = next(v["path_idle_ms"] for v in checked.values() if "path_ms" in v)
            lines.append(
                f"Serving path on the same runs, mean ms measured / modelled (modelled at the run's measured "
                f"step stretch; {idle} ms at idle): " + "; ".join(paths) + "\n"
            )
    if validation.get("timeline"):  # the sitting, in order: what ran when
        parts = [f"{p['part']} {p['started']} ({p['minutes']} min)" for p in validation["timeline"]]
        lines.append("Sitting: " + "; ".join(parts) + "\n")
    return lines + split_lines(validation) + step_lines(validation)


def speed_matched_lines(matched: dict | None) -> list[str]:
    """The speed-matched comparison (speed_matched) as a table: each real run beside the simulator on a
    machine that run's factor slower, and the means."""
    if not matched:
        return []
    factors = matched["factors"]
    each = [f"run {i + 1} (x{f['stack']:.3f}): real / sim" for i, f in enumerate(factors)]
    header = ["metric", *each, "mean: real / sim", "sim vs real (means)"]
    lines = [
        "Speed-matched: each real run against the simulator on a machine as much slower than the profile's "
        "as that run's was (xF: the stack's CPU over the profile's model of the same work, from the run's "
        "CPU accounting; engines' / path's apart: "
        + ", ".join(f"{f['engine']:.3f} / {f['path']:.3f}" for f in factors)
        + "):\n",
        "| " + " | ".join(header) + " |",
        "|---|" + "---:|" * (len(header) - 1),
    ]
    for name in METRICS:
        m = matched[name]
        pairs = [
            f"{r} / {x} ({_pct(d)})" for r, x, d in zip(m["real_runs"], m["sim_runs"], m["rel_diff_runs"])
        ]
        cells = [name, *pairs, f"{m['real']} / {m['sim']}", _pct(m["rel_diff"])]
        lines.append("| " + " | ".join(cells) + " |")
    outside = matched["outside_15pct"]
    runs = {m: r for m, r in matched["runs_outside_15pct"].items() if r}
    verdict = f"outside 15 %: {', '.join(outside)}" if outside else "means all within 15 %"
    if runs:
        verdict += "; single runs outside 15 %: " + ", ".join(
            f"{m} (run {', '.join(map(str, r))})" for m, r in runs.items()
        )
    return lines + [f"\n{verdict}\n"]


def paired_lines(paired: list[dict] | None) -> list[str]:
    """Request by request (bench/sim_arrivals.py paired), each real run against the model under its first
    seed: how the real TPOT stands to the simulated one."""
    if not paired:
        return []
    lines = ["Request by request, TPOT real over simulated (the model's first seed), p10 / p50 / p90:"]
    for i, p in enumerate(paired):
        if not p:
            continue
        own = (p.get("on_own_replica") or {}).get("real", {})
        lines.append(
            f"- run {i + 1}: {' / '.join(map(str, p['tpot_real_over_sim']))} (correlation "
            f"{p['tpot_correlation']}; the ratio's correlation with the requests decoding beside each, "
            f"simulated {p['ratio_vs_decoding_beside_sim']}, real {p['ratio_vs_decoding_beside_real']}"
            + (f"; share of that company on its own replica, real {own['share_on_own']}" if own else "")
            + ")"
        )
        windows = p.get("by_window")
        if windows:  # how each side follows the trace's load
            lines[-1] += (
                f"; mean TPOT over each {windows['width_s']:g} s of arrivals, real on simulated: slope "
                f"{windows['slope_real_on_sim']}, correlation {windows['correlation']}"
            )
    return lines + [""]


SPLIT_PARTS = (("path_s", "serving path"), ("queue_s", "engine queue"), ("prefill_s", "prefill"))


def split_lines(validation: dict) -> list[str]:
    """TTFT in parts (bench/ttft_split.py), in ms: each real run's (from its replicas' per-request
    timing) and each simulated variant's, mean / p50 / p99 of each part, when recorded."""
    split = validation.get("ttft_split")
    if not split:
        return []
    rows = [(f"real run {i + 1}", run) for i, run in enumerate(split.get("real_runs") or [])]
    rows += [(label, parts) for label, parts in split.items() if label != "real_runs"]
    header = ["", "requests", *(f"{title} mean / p50 / p99" for _, title in SPLIT_PARTS), "path in"]
    lines = [
        "TTFT in parts, ms (serving path both ways, engine queue, prefill; real: the replicas' timing; "
        "path in: of the path, arrival to the replica; the sim's, the whole path when its profile does not "
        "split it):\n",
        "| " + " | ".join(header) + " |",
        "|---|" + "---:|" * (len(header) - 1),
    ]
    for label, parts in rows:
        cells = [label, str(parts["requests"])]
        for key, _ in (*SPLIT_PARTS, ("inbound_s", "")):
            spread = parts.get(key) or {}
            cells.append(" / ".join(_ms(spread.get(q)) for q in ("mean", "p50", "p99")))
        lines.append("| " + " | ".join(cells) + " |")
    if not split.get("real_runs"):
        lines.append("\n(No per-request timing from the real runs: measured before the replicas sent it.)")
    return lines + [""]


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.1f}"


def step_lines(validation: dict) -> list[str]:
    """The engines' steps over the whole trace, each real run's and the simulator's, when recorded."""
    real = validation.get("real_engine_steps")
    sim = validation.get("sim_engine_steps")
    if not real or not sim:
        return []
    real = real if isinstance(real, list) else [real]
    rows = [(f"real run {i + 1}", step_view(r)) for i, r in enumerate(real)] + [("sim", step_view(sim))]
    lines = [
        "Engines' steps over the whole trace (both replicas):\n",
        "| | " + " | ".join(title for _, title in STEP_COLUMNS) + " |",
        "|---|" + "---:|" * len(STEP_COLUMNS),
    ]
    for label, view in rows:
        cells = ("-" if view[key] is None else str(view[key]) for key, _ in STEP_COLUMNS)
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    shared = [f"{label} {view['other_cores']}" for label, view in rows if (view["other_cores"] or 0) > SHARED]
    if shared:
        lines.append(
            f"\nOther work kept cores busy during the real runs ({', '.join(shared)}): the machine was "
            "shared, and these real figures measure a slower machine than the profile describes."
        )
    return lines + [""]


SHARED = 0.1  # cores of other work during a real run above which the report says the machine was shared


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1%}"
