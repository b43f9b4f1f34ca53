"""The cost table SPS(B): verify steps per second of a target forward with B tokens across the batch.

Profiled once with the engine's own runner (dummy requests with cached context), densely at small B
where the rate changes fastest and geometrically above, refined where neighbours differ, smoothed by
an isotonic (pool-adjacent-violators) fit so SPS never rises with B, and linearly interpolated in
between. Tables are cached as JSON under a key of model, hardware and engine configuration, and heal
online: every observed step moves its bucket by an exponential moving average.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import math
import os
import platform
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from dspark.runner import ForwardItem, ModelRunner
from dspark.scheduler import convex_rates

FORMAT_VERSION = 1


def isotonic_non_increasing(values: list[float], weights: list[float] | None = None) -> list[float]:
    """The weighted least-squares non-increasing fit of `values` (pool adjacent violators)."""
    weights = weights or [1.0] * len(values)
    blocks: list[list[float]] = []  # [mean, weight, count]
    for v, w in zip(values, weights):
        blocks.append([v, w, 1])
        while len(blocks) > 1 and blocks[-2][0] < blocks[-1][0]:
            (m1, w1, n1), (m2, w2, n2) = blocks[-2], blocks.pop()
            blocks[-1] = [(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, n1 + n2]
    return [m for m, _, n in blocks for _ in range(n)]


class CostTable:
    """SPS(B) for B = 1 .. max_tokens, from measured rates at `points` (ascending, starting at 1)."""

    # Observations folded into `rates` before the fitted lookups are refreshed. A refit (pooling, the
    # convex envelope, the dense lists) costs ~0.2 ms in Python, 4-5 % of a small target's step on a
    # CPU if paid every step; at the engine's weight of 0.05 a step the table moves ~0.3 % in 8 steps.
    refit_every = 8

    def __init__(self, points: list[int], rates: list[float], max_tokens: int, source: str = "given") -> None:
        if not points or points[0] != 1 or any(b <= a for a, b in zip(points, points[1:])):
            raise ValueError("points must be ascending and start at B = 1")
        if len(rates) != len(points) or not all(r > 0 and math.isfinite(r) for r in rates):
            raise ValueError("need one positive finite rate per point")
        self.points, self.rates, self.max_tokens = list(points), [float(r) for r in rates], max_tokens
        self.profiled = list(self.rates)  # as given (profiled or cached); `rates` then follow observations
        self.source = source  # "profiled", "cache" or "given": where the table came from
        self.path: Path | None = None  # its cache file, when it has one
        self.observations = 0
        self._unfitted = 0  # observations in `rates` that the lookups do not reflect yet
        self._fit()

    def _fit(self) -> None:
        self._unfitted = 0
        self.smoothed = isotonic_non_increasing(self.rates)
        tokens = np.arange(1, self.max_tokens + 1)
        self._dense = np.interp(tokens, self.points, self.smoothed)
        # The scheduler's walk reads the convex envelope of the step time (dspark/scheduler.py says why).
        self._convex = 1.0 / np.interp(
            tokens, self.points, 1.0 / np.array(convex_rates(self.points, self.smoothed))
        )
        # The same values as Python floats: the scheduler's walk reads one per ranked token, and indexing
        # a list costs a fraction of indexing an array and converting its element.
        self._dense_list, self._convex_list = self._dense.tolist(), self._convex.tolist()

    def __call__(self, num_tokens: int) -> float:
        if 1 <= num_tokens <= self.max_tokens:  # the usual case, without min() and max() calls
            return self._dense_list[num_tokens - 1]
        return self._dense_list[min(max(num_tokens, 1), self.max_tokens) - 1]

    def convex(self, num_tokens: int) -> float:
        """SPS(B) with the step time's convex envelope: what Algorithm 1's early stop walks on (once per
        ranked token: the comparison below halves the lookup's cost against min() and max())."""
        if 1 <= num_tokens <= self.max_tokens:
            return self._convex_list[num_tokens - 1]
        return self._convex_list[min(max(num_tokens, 1), self.max_tokens) - 1]

    def observe(self, num_tokens: int, seconds: float, weight: float) -> None:
        """Fold one observed forward into the table, so drift (heat, neighbours, context) heals."""
        if seconds <= 0 or weight <= 0:
            return
        k = bisect.bisect_right(self.points, num_tokens) - 1
        # Carry the observation at B to its bucket's point along the table's own shape.
        target = self.smoothed[k] / (seconds * self(num_tokens))
        self.rates[k] += weight * (target - self.rates[k])
        self.observations += 1
        self._unfitted += 1
        if self._unfitted >= self.refit_every:
            self._fit()

    def to_dict(self) -> dict:
        if self._unfitted:
            self._fit()
        return {
            "max_tokens": self.max_tokens,
            "points": self.points,
            "rates": [round(r, 6) for r in self.rates],
            "smoothed": [round(r, 6) for r in self.smoothed],
            "source": self.source,
            "observations": self.observations,
        }


@dataclass(frozen=True)
class ProfileShape:
    """Everything besides the model and the hardware that shapes a verify forward and its speed."""

    max_tokens: int  # B runs over 1 .. max_tokens (the engine's max_num_batched_tokens)
    max_seqs: int
    gamma: int  # a verifying request runs gamma + 1 tokens
    context_len: int  # tokens each dummy request already has in the cache
    page_size: int
    dtype: str
    device: str
    tap_layers: tuple[int, ...] = ()
    coarse: bool = False  # fewer points and repetitions: for tiny models and tests
    # Profiled on rank 0 of this many shards, the others in lockstep: all-reduces and smaller matmuls
    # make a sharded forward's speed its own.
    tensor_parallel_size: int = 1


def default_cache_dir() -> Path:
    if os.environ.get("DSPARK_CACHE_DIR"):
        return Path(os.environ["DSPARK_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "dspark"


def fingerprint(model_dir: str | Path, shape: ProfileShape) -> dict:
    """What a table is valid for: model (config, weight files), hardware, engine configuration."""
    model_dir = Path(model_dir)
    weights = [
        [p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in sorted(model_dir.glob("*.safetensors"))
    ]
    if shape.device.startswith("cuda"):
        device_name = torch.cuda.get_device_name(torch.device(shape.device))
    else:
        device_name = _cpu_model()
    return {
        "model": {
            "config_sha256": hashlib.sha256((model_dir / "config.json").read_bytes()).hexdigest(),
            "weights": weights,
        },
        "hardware": {"device": device_name, "threads": torch.get_num_threads(), "torch": torch.__version__},
        "engine": {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(shape).items()},
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cache_path(fp: dict, cache_dir: str | Path | None = None) -> Path:
    """Where the table of fingerprint `fp` is cached: one file per distinct fingerprint."""
    key = hashlib.sha256(json.dumps(fp, sort_keys=True).encode()).hexdigest()[:20]
    return Path(cache_dir or default_cache_dir()) / f"sps-{key}.json"


def load_or_profile(
    runner: ModelRunner,
    model_dir: str | Path,
    shape: ProfileShape,
    cache_dir: str | Path | None = None,
    force: bool = False,
) -> CostTable:
    """The cached table for this fingerprint, or a fresh profile (also when `force`) written to the cache."""
    fp = fingerprint(model_dir, shape)
    path = cache_path(fp, cache_dir)
    if not force and path.is_file():
        try:
            data = json.loads(path.read_text())
            if data.get("version") == FORMAT_VERSION and data.get("fingerprint") == fp:
                table = CostTable(data["points"], data["rates"], data["max_tokens"], source="cache")
                table.path = path
                return table
        except (OSError, ValueError, KeyError):
            pass  # unreadable or stale: profile again and overwrite
    table = profile(runner, shape)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps({"version": FORMAT_VERSION, "fingerprint": fp, **table.to_dict()}, indent=1))
    os.replace(tmp, path)  # atomic: a concurrent reader sees the old file or the new one
    table.path = path
    return table


def profile(runner: ModelRunner, shape: ProfileShape) -> CostTable:
    """Time real runner forwards at a grid of B, refining where neighbouring rates differ by > 10 %.

    Writes garbage K/V into the cache, so it must run while no request holds blocks.
    """
    repeats, max_extra = (2, 4) if shape.coarse else (5, 24)
    grid = _grid(shape.max_tokens, shape.coarse)
    rates: dict[int, float] = {}
    with tqdm(total=len(grid), desc="profiling SPS(B)", unit="B", disable=None) as bar:
        for _ in range(2):  # warm-up: first calls pay for allocation and kernel selection
            _time_forward(runner, shape, grid[-1])
        todo, extra = list(grid), 0
        while todo:
            for b in todo:
                _time_forward(runner, shape, b)
                rates[b] = 1.0 / statistics.median(_time_forward(runner, shape, b) for _ in range(repeats))
                bar.update(1)
            points = sorted(rates)
            todo = [
                (a + b) // 2
                for a, b in zip(points, points[1:])
                if b - a > 1 and abs(rates[a] - rates[b]) > 0.1 * max(rates[a], rates[b])
            ][: max_extra - extra]
            extra += len(todo)
            bar.total += len(todo)
    points = sorted(rates)
    return CostTable(points, [rates[b] for b in points], shape.max_tokens, source="profiled")


def _grid(max_tokens: int, coarse: bool) -> list[int]:
    dense, ratio = (4, 2.0) if coarse else (16, 1.25)
    points = set(range(1, min(dense, max_tokens) + 1))
    b = dense
    while b < max_tokens:
        b = max(b + 1, math.ceil(b * ratio))
        points.add(min(b, max_tokens))
    return sorted(points)


def _time_forward(runner: ModelRunner, shape: ProfileShape, num_tokens: int) -> float:
    """Seconds of one verify-shaped forward: B tokens over as many requests as gamma + 1 windows need."""
    num_seqs = min(shape.max_seqs, num_tokens, max(1, math.ceil(num_tokens / (shape.gamma + 1))))
    num_pages = runner.kv.num_pages
    items = []
    for r in range(num_seqs):
        n = num_tokens // num_seqs + (r < num_tokens % num_seqs)
        blocks = math.ceil((shape.context_len + n) / shape.page_size)
        # Dummy requests may share pages: only the amount of attention work matters here.
        table = [(r * blocks + i) % num_pages for i in range(blocks)]
        items.append(ForwardItem([r % 2] * n, shape.context_len, table, logits_from=0))
    start = time.perf_counter()
    runner.forward(items, shape.tap_layers)  # returns logits on the CPU, so the device has finished
    return time.perf_counter() - start
