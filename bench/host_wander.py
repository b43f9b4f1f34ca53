"""Whether this machine's speed wanders per core or for the whole host: two engines pinned to the two cores.

One engine's steps wander in speed by themselves (bench/step_noise.py: a log sd of about 0.2, correlated
over hundreds of milliseconds). The simulator (sim/noise.py) must know whether that wander is each core's
own or the host's, shared by every engine on it: two replicas on one host then slow down together. Here
two processes, each pinned to its own core with one torch thread, load the demo target and time the same
one-token forward (dspark/cost_table.py's verify-shaped forward) back to back for --seconds, from one
start time. Per core: the forwards' median and the log sd around it; between the cores: the correlation
of their mean log forward time over windows of 20 ms to 1 s (near 1: one host's wander; near 0: each
core's own). Writes OUT (bench/results/host_wander.json) and its plot beside it.

    python bench/host_wander.py --models models [--seconds 90]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from anywhere

WINDOWS_S = (0.02, 0.05, 0.2, 1.0)


def forwards(core: int, target: str, start_at: float, seconds: float, out: str) -> None:
    """On `core` alone: one-token forwards of the target back to back from `start_at` (wall clock) for
    `seconds`, each row (start, seconds) written to `out`."""
    os.sched_setaffinity(0, {core})
    import torch

    torch.set_num_threads(1)
    from dspark.config import EngineConfig
    from dspark.cost_table import _time_forward
    from dspark.engine import Engine

    engine = Engine(EngineConfig(model=target, scheduler="plain", num_speculative_tokens=0))
    shape = engine.cost_table_shape()
    for _ in range(5):  # warm: the first forwards pay for allocation
        _time_forward(engine.runner, shape, 1)
    while time.time() < start_at:
        time.sleep(0.001)
    rows = []
    while (now := time.time()) < start_at + seconds:
        rows.append((now, _time_forward(engine.runner, shape, 1)))
    Path(out).write_text(json.dumps(rows))


def measure(models: Path, seconds: float, work: Path) -> list[np.ndarray]:
    """Each core's rows (start, seconds) as an array, cores 0 and 1 measured at once."""
    start_at = time.time() + 30.0  # both loaded and warm by then
    ctx = multiprocessing.get_context("spawn")
    outs = [work / f"core{core}.json" for core in (0, 1)]
    procs = [
        ctx.Process(target=forwards, args=(core, str(models / "target"), start_at, seconds, str(out)))
        for core, out in zip((0, 1), outs)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise RuntimeError(f"a measuring process failed (exit {p.exitcode})")
    return [np.asarray(json.loads(out.read_text()), dtype=float) for out in outs]


def window_means(
    rows: np.ndarray, start: float, window_s: float, windows: int
) -> tuple[np.ndarray, np.ndarray]:
    """The mean log forward time of the forwards started in each window, and how many there were."""
    index = np.floor((rows[:, 0] - start) / window_s).astype(int)
    keep = (index >= 0) & (index < windows)
    sums = np.bincount(index[keep], np.log(rows[keep, 1]), minlength=windows)
    counts = np.bincount(index[keep], minlength=windows)
    return np.divide(sums, counts, out=np.zeros(windows), where=counts > 0), counts


def wander(cores: Sequence[np.ndarray]) -> dict:
    """Per core, the forwards' median and log sd; between the two, the correlation of their window means
    at each of WINDOWS_S (windows where both ran a forward)."""
    a, b = cores
    start = max(a[0, 0], b[0, 0])
    span = min(a[-1, 0], b[-1, 0]) - start
    by_window = []
    for window in WINDOWS_S:
        n = int(span / window)
        (ma, na), (mb, nb) = (window_means(rows, start, window, n) for rows in (a, b))
        both = (na > 0) & (nb > 0)
        by_window.append(
            {
                "window_ms": round(window * 1e3),
                "windows": int(both.sum()),
                "correlation": round(float(np.corrcoef(ma[both], mb[both])[0, 1]), 3),
                "log_sd_of_means": [round(float(m[both].std()), 4) for m in (ma, mb)],
            }
        )
    return {
        "cores": [
            {
                "forwards": int(rows.shape[0]),
                "median_ms": round(float(np.median(rows[:, 1])) * 1e3, 3),
                "log_sd": round(float(np.log(rows[:, 1] / np.median(rows[:, 1])).std()), 4),
            }
            for rows in cores
        ],
        "between_cores": by_window,
    }


def plot(cores: Sequence[np.ndarray], result: dict, path: Path) -> None:
    """Each core's mean log forward over 1 s windows in time, and the correlation by window."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (series, corr) = plt.subplots(1, 2, figsize=(11, 3.5))
    start = max(rows[0, 0] for rows in cores)
    n = int(min(rows[-1, 0] for rows in cores) - start)
    for core, rows in enumerate(cores):
        means, counts = window_means(rows, start, 1.0, n)
        series.plot(np.exp(means[counts > 0]) * 1e3, label=f"core {core}")
    series.set_xlabel("second of the run")
    series.set_ylabel("mean forward (ms, geometric)")
    series.legend()
    series.set_title("Each core's forwards, 1 s windows")
    rows = result["between_cores"]
    corr.plot([r["window_ms"] for r in rows], [r["correlation"] for r in rows], marker="o")
    corr.set_xscale("log")
    corr.set_ylim(-0.1, 1.0)
    corr.set_xlabel("window (ms)")
    corr.set_ylabel("correlation between the cores")
    corr.set_title("The two cores' speeds, window by window")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", type=Path, default=REPO / "models")
    p.add_argument("--seconds", type=float, default=90.0)
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "host_wander.json")
    args = p.parse_args(argv)
    if (os.cpu_count() or 1) < 2:
        p.error("needs two cores")
    command = "python bench/host_wander.py " + " ".join(argv if argv is not None else sys.argv[1:])
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as work:
        cores = measure(args.models, args.seconds, Path(work))
    result = {"command": command.strip(), "started": started, "seconds": args.seconds, **wander(cores)}
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    plot(cores, result, args.out.with_suffix(".png"))
    print(json.dumps(result, indent=1))
    print("wrote", args.out, args.out.with_suffix(".png"))


if __name__ == "__main__":
    main()
