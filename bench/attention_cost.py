"""What a forward's padded attention costs on this machine: the engine's own runner, timed on batches that
differ only in their requests' contexts.

The engine pads every request to the longest (dspark/attention.py gathers keys into [requests, longest
context] and queries into [requests, most new tokens]), so a forward's time grows with its requests times
its longest context, and times its most new tokens, while its SPS table prices it by its tokens alone,
timed at one context (sim/attention.py). This times one engine's runner (the validation's engine
settings, one torch thread, outside Ray) on B requests of n new tokens each, all at one context c, for B
in REQUESTS, n in TOKENS (a decode step, a verify window, a prompt chunk) and c in CONTEXTS, repetitions
interleaved across the batches so a drift of the machine's speed falls on all of them alike; and, beside
them, one request at the longest context with the others short (the padding: it should cost about what
all of them long does). The prices of a padded key, `s_per_key`, and of a padded query-key,
`s_per_query_key`, are the least-squares fit of the forward's median time on its keys (B x (c + n)) and
query-keys (that times n) within each (B, n) batch shape (each shape its own intercept: the rest of the
forward). Writes OUT (bench/results/attention_cost.json) and its plot.

    python bench/attention_cost.py --models models [--repeats 15] [--out bench/results/attention_cost.json]
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

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from anywhere

REQUESTS = (1, 4, 8, 16)
TOKENS = (1, 8, 48)  # a decode token; gamma + 1 on the validation's engine (a verify window); a prompt chunk
CONTEXTS = (32, 96, 192, 288, 384)
SHORT = 48  # the others' context beside one long request


def measure(models: Path, repeats: int = 15) -> dict:
    """Median forward times (ms) of each batch, and the shape of the engine's SPS table."""
    import torch

    torch.set_num_threads(1)
    from bench.sim_validate import ENGINE
    from dspark.config import EngineConfig
    from dspark.engine import Engine
    from dspark.runner import ForwardItem

    engine = Engine(EngineConfig(model=str(models / "target"), **ENGINE))
    runner, taps, page = engine.runner, engine.drafter.target_layer_ids, engine.config.kv_page_size
    num_pages = runner.kv.num_pages

    def batch(contexts: Sequence[int], n: int) -> list:
        # Garbage K/V in pages that may repeat: only the amount of attention work matters (no request
        # holds pages in this engine), as the engine's own table profiling does.
        items, first = [], 0
        for c in contexts:
            pages = -(-(c + n) // page)
            items.append(ForwardItem([1] * n, c, [(first + i) % num_pages for i in range(pages)], 0))
            first += pages
        return items

    shapes = []
    for b in REQUESTS:
        for n in TOKENS:
            for c in CONTEXTS:
                shapes.append({"requests": b, "tokens_each": n, "context": c, "contexts": [c] * b})
            if b > 1:
                mixed = [max(CONTEXTS)] + [SHORT] * (b - 1)
                shapes.append({"requests": b, "tokens_each": n, "context": "mixed", "contexts": mixed})
    batches = [batch(s["contexts"], s["tokens_each"]) for s in shapes]
    times: list[list[float]] = [[] for _ in shapes]
    order = list(range(len(shapes)))
    rng = random.Random(0)
    for items in batches[:3]:  # warm: first calls allocate
        runner.forward(items, taps)
    for rep in range(repeats):
        rng.shuffle(order)
        for i in order:
            start = time.perf_counter()
            runner.forward(batches[i], taps)
            times[i].append(time.perf_counter() - start)
        print(f"\rrepeat {rep + 1} / {repeats}", end="", flush=True)
    print()
    shape = engine.cost_table_shape()
    points = []
    for s, t in zip(shapes, times):
        n = s["tokens_each"]
        points.append(
            {
                "requests": s["requests"],
                "tokens_each": n,
                "context": s["context"],
                "keys": s["requests"] * (max(s["contexts"]) + n),
                "query_keys": s["requests"] * (max(s["contexts"]) + n) * n,
                "forward_ms": round(1e3 * statistics.median(t), 4),
            }
        )
    return {
        "points": points,
        "table_shape": {
            "context_len": shape.context_len,
            "gamma": shape.gamma,
            "max_seqs": shape.max_seqs,
        },
    }


def fit(points: Sequence[dict]) -> dict:
    """The prices of a padded key and of a padded query-key: the least-squares fit (never below 0) of the
    forward's seconds on (keys, query-keys) over the uniform-context points, each (requests, tokens)
    shape centred on its own means (its intercept is the rest of its forward), and how well they explain
    them beside keys alone; each shape's own slope on keys; and each mixed batch's forward over its shape's
    at the longest context (the padding: about 1)."""
    from sim.step_fit import nonnegative_least_squares

    shapes: dict[tuple[int, int], list[dict]] = {}
    for p in points:
        if p["context"] != "mixed":
            shapes.setdefault((p["requests"], p["tokens_each"]), []).append(p)
    rows, ys, own = [], [], []
    for (b, n), pts in sorted(shapes.items()):
        k = np.array([p["keys"] for p in pts], float)
        t = np.array([p["forward_ms"] / 1e3 for p in pts], float)
        k, t = k - k.mean(), t - t.mean()
        rows += [[key, key * n] for key in k]  # a shape's query-keys are its keys times its tokens each
        ys += list(t)
        if len(pts) > 1 and np.dot(k, k) > 0:
            own.append(
                {"requests": b, "tokens_each": n, "us_per_key": round(float(k @ t / (k @ k)) * 1e6, 4)}
            )
    x, y = np.array(rows), np.array(ys)
    if not own:
        raise ValueError("the points do not vary their keys within a batch shape: nothing to fit")
    per_key, per_query_key = nonnegative_least_squares(x.tolist(), y.tolist(), "keys and query-keys")
    residual = y - x @ [per_key, per_query_key]
    alone = float(x[:, 0] @ y / (x[:, 0] @ x[:, 0]))
    alone_residual = y - alone * x[:, 0]
    longest = {(p["requests"], p["tokens_each"]): p for p in points if p["context"] == max(CONTEXTS)}
    mixed = [
        {
            "requests": p["requests"],
            "tokens_each": p["tokens_each"],
            "over_longest": round(
                p["forward_ms"] / longest[(p["requests"], p["tokens_each"])]["forward_ms"], 3
            ),
        }
        for p in points
        if p["context"] == "mixed" and (p["requests"], p["tokens_each"]) in longest
    ]
    return {
        "s_per_key": per_key,
        "s_per_query_key": per_query_key,
        "r2": round(1.0 - float(residual @ residual) / float(y @ y), 4),
        "r2_keys_alone": round(1.0 - float(alone_residual @ alone_residual) / float(y @ y), 4),
        "by_shape": own,
        "mixed": mixed,
    }


def block(result: dict) -> dict:
    """The profile's `attention` block (sim/attention.py) from a measurement, with its source."""
    f, shape = result["fit"], result["table_shape"]
    return {
        "s_per_key": round(f["s_per_key"], 12),
        "s_per_query_key": round(f["s_per_query_key"], 14),
        "table_context": shape["context_len"],
        "table_gamma": shape["gamma"],
        "table_max_seqs": shape["max_seqs"],
        "source": (
            f"bench/attention_cost.py's measurement ({result['command']}, started {result['started']}): the "
            "engine's runner at one torch thread, batches of 1-16 requests of 1, 8 or 48 tokens at contexts "
            "32-384; the least-squares fit of the median forward on padded keys and query-keys within each "
            f"batch shape, {f['s_per_key'] * 1e6:.3f} us a key and {f['s_per_query_key'] * 1e6:.4f} us a "
            f"query-key (r2 {f['r2']}; keys alone {f['r2_keys_alone']}); the table's requests each held "
            f"{shape['context_len']} tokens (the engine's ProfileShape)"
        ),
    }


def plot(result: dict, path: Path) -> None:
    """Forward time against padded keys per batch shape, the fitted prices through each shape's mean (a
    shape of n tokens each: s_per_key + n s_per_query_key a key); a log scale, the shapes spanning 2-80 ms."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    f = result["fit"]
    fig, ax = plt.subplots(figsize=(8, 5))
    shapes = sorted({(p["requests"], p["tokens_each"]) for p in result["points"]})
    colours = plt.cm.tab20(np.linspace(0, 1, 20))
    for i, (b, n) in enumerate(shapes):
        pts = [p for p in result["points"] if (p["requests"], p["tokens_each"]) == (b, n)]
        uniform = [p for p in pts if p["context"] != "mixed"]
        keys = np.array([p["keys"] for p in uniform], float)
        ms = np.array([p["forward_ms"] for p in uniform], float)
        slope = f["s_per_key"] + n * f.get("s_per_query_key", 0.0)
        (line,) = ax.plot(
            keys, ms, marker="o", linestyle="none", color=colours[i % 20], label=f"{b} x {n} tokens"
        )
        ax.plot(keys, ms.mean() + 1e3 * slope * (keys - keys.mean()), color=line.get_color(), linewidth=0.8)
        for p in pts:
            if p["context"] == "mixed":
                ax.plot([p["keys"]], [p["forward_ms"]], marker="x", color=line.get_color(), markersize=9)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("padded keys (requests x longest context)")
    ax.set_ylabel("forward ms (median)")
    ax.set_title(
        f"Padded attention: {f['s_per_key'] * 1e6:.2f} us a key, "
        f"{f.get('s_per_query_key', 0.0) * 1e6:.3f} us a query-key\n(x: one request long, the rest short)",
        fontsize=10,
    )
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run(models: Path, repeats: int, command: str) -> dict:
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    result = {"command": command, "started": started, **measure(models, repeats)}
    result["fit"] = fit(result["points"])
    return result


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", type=Path, default=REPO / "models")
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "attention_cost.json")
    args = p.parse_args(argv)
    command = "python bench/attention_cost.py " + " ".join(argv if argv is not None else sys.argv[1:])
    result = run(args.models, args.repeats, command.strip())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    plot(result, args.out.with_suffix(".png"))
    print(json.dumps(result["fit"], indent=1))
    print("wrote", args.out, args.out.with_suffix(".png"))


if __name__ == "__main__":
    main()
