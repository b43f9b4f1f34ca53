"""Acceptance of every drafter on held-out prompts of each domain, at temperature 0 and 1, block 7.

Per row: tau (tokens per verify round, bonus included), per-position conditional acceptance, prefix
survival, and for drafters with a confidence head the calibration of the survival estimate (ECE raw
and after STS, AUC, Brier). Also the Markov-head ablation (DSpark trained with rank 0). Evaluation
prompts are the odd-indexed held-out windows; calibration was fitted on the even-indexed ones.

    python bench/accept.py --models models
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from drafter_service.calibration.rounds import run_rounds  # noqa: E402
from drafter_service.calibration.sts import calibration_report  # noqa: E402
from drafter_service.demo import corpus  # noqa: E402
from drafter_service.models.checkpoint import read_config  # noqa: E402
from dspark import LLM, SamplingParams  # noqa: E402
from dspark.checkpoint import load_checkpoint  # noqa: E402

RESULTS = Path(__file__).parent / "results"
# Row name -> checkpoint directory under models/drafters.
DRAFTERS = {
    "dspark": "dspark",
    "dflash": "dflash",
    "eagle3": "eagle3",
    "mtp1": "mtp1",
    "dspark_markov_r0": "dspark_r0",
}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", default="models")
    parser.add_argument("--prompts", type=int, default=32, help="per domain")
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--block-size", type=int, default=7)
    args = parser.parse_args()
    target = Path(args.models) / "target"
    tokenizer = AutoTokenizer.from_pretrained(target)
    prompts = {
        d: corpus.heldout_prompts(d, 2 * args.prompts, args.prompt_tokens, tokenizer)[1::2]
        for d in corpus.DOMAINS
    }
    target_config = load_checkpoint(target, load_tokenizer=False).config
    rows = []
    for row_name, subdir in DRAFTERS.items():
        path = Path(args.models) / "drafters" / subdir
        cfg = read_config(path, target_config)  # the target's config reads the previous layout too
        gamma = min(args.block_size, cfg.draft_length)
        llm = LLM(
            str(target),
            drafter=cfg.kind,
            drafter_model=str(path),
            num_speculative_tokens=gamma,
            scheduler="fixed",
            max_num_seqs=16,
            kv_cache_memory_mb=256,
        )
        for domain, domain_prompts in prompts.items():
            for temperature in (0.0, 1.0):
                params = SamplingParams(
                    temperature=temperature, max_tokens=args.new_tokens, ignore_eos=True, seed=1
                )
                log = run_rounds(str(target), cfg.kind, domain_prompts, params, gamma, llm=llm)
                row = {
                    "drafter": row_name,
                    "domain": domain,
                    "temperature": temperature,
                    "block_size": gamma,
                    **log.acceptance(),
                }
                if cfg.enable_confidence_head:
                    temps = cfg.sts_temperatures.get(temperature, [1.0] * gamma)
                    row.update(calibration_report(*log.tensors(), temps))
                else:
                    row.update({"ece_raw": None, "ece_sts": None, "auc": None, "brier": None})
                rows.append(row)
                print(f"{row_name:18s} {domain:5s} T={temperature:.0f}: tau {row['tau']:.3f}", flush=True)
    summary = summarize(rows)
    result = {"command": "python bench/accept.py " + " ".join(sys.argv[1:]), "rows": rows, "summary": summary}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "accept.json").write_text(json.dumps(result, indent=2) + "\n")
    (RESULTS / "accept.md").write_text(table(result))
    plot(rows, RESULTS / "accept_by_position.png")
    print(table(result))


def tau_of(rows, drafter, domain, temperature) -> float:
    return next(
        r["tau"]
        for r in rows
        if (r["drafter"], r["domain"], r["temperature"]) == (drafter, domain, temperature)
    )


def summarize(rows) -> dict:
    out = {}
    for domain in corpus.DOMAINS:
        for t in (0.0, 1.0):
            key = f"{domain}_T{t:g}"
            ds = tau_of(rows, "dspark", domain, t)
            out[key] = {
                "tau_dspark_over_dflash": round(ds / tau_of(rows, "dflash", domain, t), 3),
                "tau_dspark_over_eagle3": round(ds / tau_of(rows, "eagle3", domain, t), 3),
                "tau_dspark_over_markov_r0": round(ds / tau_of(rows, "dspark_markov_r0", domain, t), 3),
            }
            full = next(
                r for r in rows if (r["drafter"], r["domain"], r["temperature"]) == ("dspark", domain, t)
            )
            r0 = next(
                r
                for r in rows
                if (r["drafter"], r["domain"], r["temperature"]) == ("dspark_markov_r0", domain, t)
            )
            out[key]["markov_gain_by_position"] = [
                round(a - b, 4) for a, b in zip(full["accept_by_position"], r0["accept_by_position"])
            ]
    return out


def table(result) -> str:
    lines = [
        "# Drafter acceptance on held-out prompts",
        "",
        f"`{result['command']}`",
        "",
        "| drafter | domain | T | block | tau | accept by position | ECE raw | ECE STS | AUC | Brier |",
        "|---|---|---:|---:|---:|---|---:|---:|---:|---:|",
    ]
    fmt = lambda v: "—" if v is None else f"{v:.3f}"
    for r in result["rows"]:
        pos = " ".join("—" if x != x else f"{x:.2f}" for x in r["accept_by_position"])
        lines.append(
            f"| {r['drafter']} | {r['domain']} | {r['temperature']:g} | {r['block_size']} | {r['tau']:.3f} | "
            f"{pos} | {fmt(r['ece_raw'])} | {fmt(r['ece_sts'])} | {fmt(r['auc'])} | {fmt(r['brier'])} |"
        )
    lines += [
        "",
        "Ratios of tau (DSpark over each baseline) and the Markov head's acceptance gain by position:",
        "",
    ]
    for key, s in result["summary"].items():
        lines.append(
            f"- {key}: vs DFlash {s['tau_dspark_over_dflash']:.3f}x, "
            f"vs EAGLE-3 {s['tau_dspark_over_eagle3']:.3f}x, "
            f"vs rank 0 {s['tau_dspark_over_markov_r0']:.3f}x; "
            f"gain by position {s['markov_gain_by_position']}"
        )
    return "\n".join(lines) + "\n"


def plot(rows, path: Path) -> None:
    fig, axes = plt.subplots(2, 2, figsize=(11, 8), sharey=True)
    for ax, (domain, t) in zip(axes.flat, [(d, t) for d in corpus.DOMAINS for t in (0.0, 1.0)]):
        for r in rows:
            if r["domain"] == domain and r["temperature"] == t:
                ys = r["accept_by_position"]
                ax.plot(range(1, len(ys) + 1), ys, marker="o", label=f"{r['drafter']} (tau {r['tau']:.2f})")
        ax.set_title(f"{domain}, temperature {t:g}")
        ax.set_xlabel("draft position k")
        ax.set_ylabel("P(accept k | 1..k-1 accepted)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
