"""The load benchmark's report: frontier math, summary, targets, markdown table and plots.

A point is (aggregate tok/s, tok/s/user). A method's frontier is its Pareto set (no other point of the
method is at least as good on both axes and better on one), sorted by rising throughput, so tok/s/user
falls along it; between points it is linear in throughput, and it is not extrapolated beyond them.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

Point = tuple[float, float]  # (aggregate tok/s, tok/s/user)
HF = "hf_assisted"
# Fewer drafted tokens verified per request-round than this and a method's drafting counts as off.
MIN_VERIFY = 0.1
SCHEDULED = "dspark_scheduled"
# One colour per method in both plots.
ORDER = ("plain", "mtp1", "dspark_fixed", SCHEDULED, "dspark_pipelined", "dflash_fixed", "eagle3", HF)
COLORS = {m: f"C{i}" for i, m in enumerate(ORDER)}


def pareto_frontier(points: Sequence[Point]) -> list[Point]:
    """The non-dominated points, by ascending throughput (tok/s/user then strictly descending)."""
    frontier: list[Point] = []
    # Highest throughput first; a point survives only if it is faster per user than every one kept.
    for total, user in sorted(points, key=lambda p: (-p[0], -p[1])):
        if not frontier or user > frontier[-1][1]:
            frontier.append((total, user))
    return frontier[::-1]


def user_speed_at(frontier: Sequence[Point], total: float) -> float | None:
    """tok/s/user of the frontier at aggregate throughput `total`; None outside its range."""
    if not frontier or not frontier[0][0] <= total <= frontier[-1][0]:
        return None
    for (t0, u0), (t1, u1) in zip(frontier, frontier[1:]):
        if t0 <= total <= t1:
            return u0 + (u1 - u0) * (total - t0) / (t1 - t0)
    return frontier[0][1]  # a single-point frontier, hit exactly


def matched_throughput_ratios(method: Sequence[Point], baseline: Sequence[Point]) -> list[dict]:
    """tok/s/user of `method` over `baseline` at each throughput level both frontiers reach.

    The levels are the points of either frontier inside the overlap of their throughput ranges, so
    each measured point is compared against the other curve interpolated at its throughput.
    """
    a, b = pareto_frontier(method), pareto_frontier(baseline)
    if not a or not b:
        return []
    lo, hi = max(a[0][0], b[0][0]), min(a[-1][0], b[-1][0])
    levels = sorted({t for t, _ in a + b if lo <= t <= hi})
    out = []
    for total in levels:
        ua, ub = user_speed_at(a, total), user_speed_at(b, total)
        if ua is not None and ub:
            out.append({"tok_s_total": total, "tok_s_user": ua, "baseline_tok_s_user": ub, "ratio": ua / ub})
    return out


def max_throughput_at(points: Sequence[Point], min_user_speed: float) -> dict:
    """Highest aggregate throughput on the frontier whose tok/s/user is still >= `min_user_speed`.

    `binding` is False when even the highest-throughput point meets the anchor (the value is then a
    lower bound: the sweep did not reach the load where the anchor starts to bite); the throughput
    is None when no point meets it.
    """
    frontier = pareto_frontier(points)
    meeting = [p for p in frontier if p[1] >= min_user_speed]
    if not meeting:
        return {"tok_s_total": None, "binding": True}
    t0, u0 = meeting[-1]  # the frontier's speed falls with throughput: the last one meeting it
    following = frontier[len(meeting)] if len(meeting) < len(frontier) else None
    if following is None:
        return {"tok_s_total": t0, "binding": False}
    t1, u1 = following
    return {"tok_s_total": t0 + (t1 - t0) * (u0 - min_user_speed) / (u0 - u1), "binding": True}


# ---- summary, table, plots -------------------------------------------------------------------------


def _frontier(points: list[dict], method: str) -> list[tuple[float, float]]:
    return [(p["tok_s_total"], p["tok_s_user"]) for p in points if p["method"] == method]


def _point(points: list[dict], method: str, concurrency: int) -> dict | None:
    return next((p for p in points if (p["method"], p["concurrency"]) == (method, concurrency)), None)


def summarize(
    points: list[dict], code_points: dict[str, dict], anchor_factor: float, hf_plain: dict | None = None
) -> dict:
    methods = list(dict.fromkeys(p["method"] for p in points))
    matched = {}
    for m in methods:
        if m in ("mtp1", HF):
            continue
        rows = matched_throughput_ratios(_frontier(points, m), _frontier(points, "mtp1"))
        ratios = [r["ratio"] for r in rows]
        matched[m] = {
            "mean": round(statistics.fmean(ratios), 3) if ratios else None,
            "min": round(min(ratios), 3) if ratios else None,
            "max": round(max(ratios), 3) if ratios else None,
            "levels": [{k: round(v, 3) for k, v in r.items()} for r in rows],
        }
    plain1 = _point(points, "plain", 1)
    anchor = round(anchor_factor * plain1["tok_s_user"], 2) if plain1 else None
    sla = {}
    for m in methods if anchor else ():
        v = max_throughput_at(_frontier(points, m), anchor)
        sla[m] = {**v, "tok_s_total": None if v["tok_s_total"] is None else round(v["tok_s_total"], 2)}
    s1, h1 = _point(points, SCHEDULED, 1), _point(points, HF, 1)
    code_ratio = None
    if "plain" in code_points and SCHEDULED in code_points:
        code_ratio = round(code_points[SCHEDULED]["tok_s_user"] / code_points["plain"]["tok_s_user"], 3)
    sla_ratio = None
    if sla.get(SCHEDULED, {}).get("tok_s_total") and sla.get("mtp1", {}).get("tok_s_total"):
        sla_ratio = round(sla[SCHEDULED]["tok_s_total"] / sla["mtp1"]["tok_s_total"], 3)
    # Credit a method only for work it did: a ratio whose drafting was (almost) off is plain decoding.
    drafted = lambda p: (p or {}).get("mean_verify_tokens") or 0.0
    credit = {
        "single_stream": drafted(code_points.get(SCHEDULED)) >= MIN_VERIFY,
        "hf_assisted": drafted(s1) >= MIN_VERIFY,
        "sla_anchor": all(drafted(p) >= MIN_VERIFY for p in points if p["method"] == SCHEDULED),
    }
    if not credit["single_stream"]:
        code_ratio = None
    if not credit["sla_anchor"]:
        sla_ratio = None
    peers = [("assisted", h1), ("generate", hf_plain)]
    best = max(
        ({"method": name, "tok_s_user": round(p["tok_s_user"], 2)} for name, p in peers if p),
        key=lambda b: b["tok_s_user"],
        default=None,
    )
    noise = {
        str(p["concurrency"]): round(abs(p["tok_s_total"] / q["tok_s_total"] - 1), 3)
        for p in points
        if p["method"] == "plain_repeat" and (q := _point(points, "plain", p["concurrency"]))
    }
    summary = {
        "noise_band_by_concurrency": noise,
        "noise_band": max(noise.values(), default=None),
        "credited": credit,
        "matched_throughput_speedup_vs_mtp1": matched.get(SCHEDULED) if credit["sla_anchor"] else None,
        "single_stream_speedup_vs_plain_code": code_ratio,
        "speedup_vs_hf_assisted": (
            round(s1["tok_s_user"] / h1["tok_s_user"], 3) if s1 and h1 and credit["hf_assisted"] else None
        ),
        # The peer at its best: transformers generate with the assistant, or without it where the assistant
        # makes it slower (`hf_plain`, measured on the same prompts and seeds).
        "transformers_best_c1": best,
        "speedup_vs_transformers_best": (
            round(s1["tok_s_user"] / best["tok_s_user"], 3) if s1 and best and credit["hf_assisted"] else None
        ),
        "sla_anchor_throughput": {
            "anchor_tok_s_user": anchor,
            "anchor_rule": f"{anchor_factor:g} x plain tok/s/user at concurrency 1",
            "by_method": sla,
            "dspark_scheduled_over_mtp1": sla_ratio,
        },
        "matched_throughput_speedup_vs_mtp1_by_method": {
            m: {k: v for k, v in r.items() if k != "levels"} for m, r in matched.items()
        },
        "throughput_vs_plain": {
            m: {
                str(p["concurrency"]): round(p["tok_s_total"] / q["tok_s_total"], 3)
                for p in points
                if p["method"] == m and (q := _point(points, "plain", p["concurrency"]))
            }
            for m in methods
            if m not in ("plain", HF)
        },
        "verify_budget_by_concurrency": {
            m: {str(p["concurrency"]): p["mean_verify_tokens"] for p in points if p["method"] == m}
            for m in methods
            if m != HF
        },
    }
    summary["targets"] = [
        {"target": t, "result": "info" if ok is None else ("pass" if ok else "miss"), "evidence": e}
        for t, ok, e in targets(summary)
    ]
    return summary


def targets(summary: dict) -> list[tuple[str, bool | None, str]]:
    """(target, met, evidence) for each target of the issue; met is None for context lines."""
    out = []
    m = summary["matched_throughput_speedup_vs_mtp1"]
    if m and m["min"] is not None:
        out.append(
            (
                ">= 1.6x MTP-1 tok/s/user at matched throughput (every matched level)",
                m["min"] >= 1.6,
                f"{m['min']:.2f}-{m['max']:.2f}x, mean {m['mean']:.2f}x over {len(m['levels'])} levels",
            )
        )
    else:
        out.append(
            (">= 1.6x MTP-1 at matched throughput", None, "no credit (drafting off) or curves do not overlap")
        )
    tp = summary["throughput_vs_plain"]
    for m in (SCHEDULED, "dspark_pipelined", "dspark_fixed"):
        if m in tp and tp[m]:
            ratios = ", ".join(f"c{c}: {r:.2f}" for c, r in tp[m].items())
            if m == "dspark_fixed":  # not a target: the contrast the scheduler exists for
                out.append(("dspark_fixed aggregate tok/s vs plain (contrast; may fall below)", None, ratios))
            elif all(v < MIN_VERIFY for v in summary["verify_budget_by_concurrency"].get(m, {}).values()):
                # Drafting was off: the ratios are plain decoding against plain decoding (noise).
                out.append(
                    (f"{m} aggregate tok/s >= plain at every concurrency", False, ratios + ", no credit")
                )
            else:
                out.append(
                    (f"{m} aggregate tok/s >= plain at every concurrency", min(tp[m].values()) >= 1.0, ratios)
                )
    r = summary["single_stream_speedup_vs_plain_code"]
    out.append(
        ("single stream >= 2x plain on code", r is not None and r >= 2.0, f"{r}x" if r else "no credit")
    )
    r, best = summary["speedup_vs_transformers_best"], summary.get("transformers_best_c1")
    out.append(
        (
            ">= 1.3x transformers generate at its best (assisted, or without the assistant where faster) "
            "at concurrency 1",
            r is not None and r >= 1.3,
            f"{r}x against {best['method']}" if r and best else "no credit",
        )
    )
    for m in (SCHEDULED, "dspark_pipelined"):
        budget = summary["verify_budget_by_concurrency"].get(m)
        if budget:
            values = list(budget.values())
            # Shrinking: overall fall, and no rise between neighbours beyond 0.25 tokens (noise).
            ok = values[-1] < values[0] and all(b <= a + 0.25 for a, b in zip(values, values[1:]))
            ok = ok and values[0] >= MIN_VERIFY  # a budget that starts at zero shrinks nothing
            evidence = " -> ".join(f"{v:.2f}" for v in values) + f" (c={', '.join(budget)})"
            out.append((f"{m} verify budget per request shrinks with concurrency", ok, evidence))
    return out


def markdown(result: dict, frontier_png: str, budget_png: str) -> str:
    s = result["summary"]
    w = result["workload"]
    loads = [p["loadavg_1m"] for p in result["points"] if "loadavg_1m" in p]
    lines = [
        "# Load sweep: tok/s/user vs aggregate throughput",
        "",
        f"`{result['command']}` — {result['wall_minutes']:.1f} min, {result['machine']['cpu_threads']} CPU "
        f"threads (load average {result['machine']['loadavg_start']} at start, "
        f"{result['machine']['loadavg_end']} at end; 1-min load after each point "
        f"{min(loads, default=0):.1f}-{max(loads, default=0):.1f}; this run's own 2 threads make about 2, "
        "more means other work shared the CPUs and the figures are noise).",
        "",
        f"Workload: {w['prompt_tokens']}-token held-out prompts (code and prose alternating, odd-indexed "
        f"windows), {w['new_tokens']} new tokens each (ignore_eos), temperature {w['temperature']:g} seeded "
        f"per request; a point keeps N streams in flight for max({w['requests_factor']}N, "
        f"{w['min_requests']}) requests. Engines: max_num_seqs {w['max_num_seqs']} for every method, "
        f"gamma {w['gamma']}.",
        "",
        "- **tok/s/user**: decode speed, mean over requests of (generated tokens - 1) / (finish time - "
        "first token time); queueing and prefill are excluded (`tok_s_user_e2e` in the JSON includes "
        "them).",
        "- **aggregate tok/s**: all generated tokens of the point / its wall time.",
        "- **verify/req**: drafted tokens put to the target per request per round (anchor excluded).",
        "- **tau**: tokens gained per request-round (accepted drafts + 1).",
        "- **draft %**: share of engine step time spent in the drafter.",
        "",
        "| method | N | tok/s/user | aggregate tok/s | verify/req | tau | draft % |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    fmt = lambda v, f: "—" if v is None else format(v, f)
    for p in result["points"]:
        lines.append(
            f"| {p['method']} | {p['concurrency']} | {p['tok_s_user']:.1f} | {p['tok_s_total']:.1f} | "
            f"{fmt(p['mean_verify_tokens'], '.2f')} | {fmt(p.get('tau'), '.2f')} | "
            f"{fmt(p.get('draft_time_fraction') and 100 * p['draft_time_fraction'], '.0f')} |"
        )
    code = result["single_stream_code"]
    lines += ["", "Concurrency 1, code prompts only:", ""]
    lines += [f"- {m}: {p['tok_s_user']:.1f} tok/s/user (tau {p['tau']:.2f})" for m, p in code.items()]
    if result.get("hf_plain"):
        a = result["hf_assistant"]
        ppl = ", ".join(f"{d} {v:.1f}" for d, v in (a["heldout_perplexity"] or {}).items() if v)
        lines += [
            "",
            f"{HF}: `generate(do_sample=True, temperature, top_k=0, top_p=1, assistant_model=...)` with "
            "transformers' default candidate schedule; the assistant is a "
            f"{a['parameters'] / 1e6:.2f}M-parameter Qwen3 trained {a['steps_done']} steps on the target's "
            f"corpus and tokenizer (held-out perplexity {ppl}). Without the assistant, transformers "
            f"generate runs {result['hf_plain']['tok_s_user']:.1f} tok/s/user on the same prompts.",
        ]
    tables = {m: e["cost_table"] for m, e in result.get("engines", {}).items() if "cost_table" in e}
    if tables:
        lines += ["", "SPS(B) tables: " + "; ".join(f"{m} {t['source']}" for m, t in tables.items()) + "."]
    m = s["matched_throughput_speedup_vs_mtp1"]
    sla = s["sla_anchor_throughput"]
    lines += [
        "",
        "## Summary",
        "",
        "- **matched-throughput speedup vs MTP-1**: each method's and MTP-1's Pareto frontiers (tok/s/user "
        "as a piecewise-linear function of aggregate tok/s, no extrapolation) are compared at every "
        "measured throughput level of either curve inside the range both reach; ratio = method's "
        "tok/s/user / MTP-1's.",
    ]
    if m and m["mean"] is not None:
        lines.append(
            f"  dspark_scheduled: mean {m['mean']:.2f}x, range {m['min']:.2f}-{m['max']:.2f}x over "
            f"{len(m['levels'])} levels."
        )
    verify = s["verify_budget_by_concurrency"]
    for name, r in s["matched_throughput_speedup_vs_mtp1_by_method"].items():
        if name != SCHEDULED and r["mean"] is not None:
            drafting_on = name in ("plain", "plain_repeat") or any(
                v >= MIN_VERIFY for v in verify.get(name, {}).values()
            )
            note = "" if drafting_on else " (its drafting was off: plain decoding, no credit to drafting)"
            lines.append(f"  {name}: mean {r['mean']:.2f}x, range {r['min']:.2f}-{r['max']:.2f}x{note}.")
    code_verify = (result["single_stream_code"].get(SCHEDULED) or {}).get("mean_verify_tokens", 0.0)
    off = "not credited: the scheduler's drafting was off (fewer than 0.1 drafted tokens verified per round)"
    verify1 = next((p["mean_verify_tokens"] for p in result["points"] if p["method"] == SCHEDULED), None)
    lines += [
        "- **single-stream speedup vs plain, code** (tok/s/user at N=1, code prompts): "
        + (
            f"{s['single_stream_speedup_vs_plain_code']}x with {code_verify:.2f} "
            "drafted tokens verified per round"
            if s["credited"]["single_stream"]
            else off
        ),
        "- **speedup vs transformers assisted generation** (tok/s/user at N=1, same prompts and seeds): "
        + (
            f"{s['speedup_vs_hf_assisted']}x with {verify1:.2f} drafted tokens verified per round"
            if s["credited"]["hf_assisted"] and verify1 is not None
            else off
        ),
        "- **speedup vs transformers at its best** (generate with the assistant, or without it where that is "
        "faster; tok/s/user at N=1): "
        + (
            f"{s['speedup_vs_transformers_best']}x against {s['transformers_best_c1']['method']}"
            if s.get("speedup_vs_transformers_best") is not None
            else off
        ),
        f"- **SLA anchor** {sla['anchor_tok_s_user']} tok/s/user ({sla['anchor_rule']}): highest aggregate "
        "tok/s on each frontier while meeting it (interpolated; `>=` marks an anchor the sweep never "
        "made binding, `none` a method that never meets it):",
    ]
    for name, v in sla["by_method"].items():
        value = (
            "none" if v["tok_s_total"] is None else f"{'' if v['binding'] else '>= '}{v['tok_s_total']:.1f}"
        )
        lines.append(f"  {name}: {value}")
    if sla["dspark_scheduled_over_mtp1"]:
        lines.append(f"  dspark_scheduled / mtp1 at the anchor: {sla['dspark_scheduled_over_mtp1']:.2f}x")
    elif not s["credited"]["sla_anchor"]:
        lines.append(f"  dspark_scheduled / mtp1 at the anchor: {off}")
    if s["noise_band"] is not None:
        band = ", ".join(f"c{c}: {100 * v:.1f}%" for c, v in s["noise_band_by_concurrency"].items())
        lines += [
            f"- **noise band**: plain_repeat (an identical second plain engine) differs from plain by up to "
            f"{100 * s['noise_band']:.1f}% in aggregate tok/s ({band}); a ratio inside it is no result.",
        ]
    lines += ["", "## Targets", ""]
    lines += [f"- **{t['result']}** — {t['target']}: {t['evidence']}" for t in s["targets"]]
    lines += ["", f"![frontier]({frontier_png})", "", f"![verify budget]({budget_png})", ""]
    return "\n".join(lines)


def plot_frontier(points: list[dict], anchor: float | None, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(8, 6))
    for m in dict.fromkeys(p["method"] for p in points):
        ps = [p for p in points if p["method"] == m]
        xs, ys = [p["tok_s_user"] for p in ps], [p["tok_s_total"] for p in ps]
        style = {"marker": "*", "markersize": 14, "linestyle": ""} if m == HF else {"marker": "o"}
        lw = 2.5 if m == SCHEDULED else 1.2
        ax.plot(xs, ys, label=m, linewidth=lw, color=COLORS.get(m), **style)
        for p, x, y in zip(ps, xs, ys):
            ax.annotate(str(p["concurrency"]), (x, y), textcoords="offset points", xytext=(4, 3), fontsize=7)
    if anchor:
        ax.axvline(
            anchor, color="grey", linestyle="--", linewidth=1, label=f"SLA anchor {anchor:.0f} tok/s/user"
        )
    ax.set_xlabel("tok/s/user (decode speed per request)")
    ax.set_ylabel("aggregate tok/s")
    ax.set_title("Throughput vs per-user speed; labels = concurrent streams")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_budget(points: list[dict], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for m in dict.fromkeys(p["method"] for p in points):
        ps = [p for p in points if p["method"] == m and p["mean_verify_tokens"] is not None]
        if m in ("plain", HF) or not ps:
            continue
        lw = 2.5 if m in (SCHEDULED, "dspark_pipelined") else 1.0
        ax.plot(
            [p["concurrency"] for p in ps],
            [p["mean_verify_tokens"] for p in ps],
            marker="o",
            label=m,
            linewidth=lw,
            color=COLORS.get(m),
        )
    concurrency = sorted({p["concurrency"] for p in points})
    ax.set_xscale("log", base=2)
    ax.set_xticks(concurrency, [str(c) for c in concurrency])
    ax.set_xlabel("concurrent streams")
    ax.set_ylabel("verified draft tokens per request per round")
    ax.set_title("Verify budget vs load")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
