"""bench/host_wander.py's figures: per core spread, and how the two cores' speeds move together."""

from __future__ import annotations

import numpy as np
import pytest

from bench.host_wander import wander, window_means


def rows(log_times: np.ndarray, step: float = 0.0025) -> np.ndarray:
    starts = np.arange(log_times.size) * step
    return np.column_stack([starts, 0.0025 * np.exp(log_times)])


def test_window_means_average_the_log_times_started_in_each_window():
    r = np.array([[0.0, 1.0], [0.4, np.e], [1.2, np.e**2], [2.5, 1.0]])
    means, counts = window_means(r, 0.0, 1.0, 3)
    assert list(counts) == [2, 1, 1] and means == pytest.approx([0.5, 2.0, 0.0])


def test_a_shared_wander_correlates_the_cores_and_separate_ones_do_not():
    rng = np.random.default_rng(0)
    n = 40_000  # 100 s of 2.5 ms forwards
    slow = np.repeat(rng.normal(0, 0.1, n // 400), 400)  # a wander holding for 1 s at a time
    shared = wander([rows(slow + rng.normal(0, 0.02, n)), rows(slow + rng.normal(0, 0.02, n))])
    apart = wander(
        [rows(slow + rng.normal(0, 0.02, n)), rows(np.roll(slow, 20_000) + rng.normal(0, 0.02, n))]
    )
    by_window = {r["window_ms"]: r["correlation"] for r in shared["between_cores"]}
    assert by_window[1000] > 0.9 and by_window[20] > 0.8
    assert abs({r["window_ms"]: r["correlation"] for r in apart["between_cores"]}[1000]) < 0.35
    assert shared["cores"][0]["forwards"] == n and shared["cores"][0]["log_sd"] == pytest.approx(
        0.1, rel=0.15
    )
