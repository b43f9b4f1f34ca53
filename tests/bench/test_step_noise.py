"""bench/step_noise.py: the spread of one engine's decode steps, how it persists, and what a request sees."""

from __future__ import annotations

import pytest

from bench.step_noise import noise


def test_a_slow_stretch_shows_as_spread_persisting_from_step_to_step_and_between_requests():
    # Ten requests of 20 decode steps each: the first five at 1 ms a step, the last five at 2 ms.
    requests = [{"decode": [0.001 if r < 5 else 0.002] * 20, "drafting_steps": r % 2} for r in range(10)]
    out = noise(requests)
    assert (out["requests"], out["decode_steps"], out["drafting_steps_left_out"]) == (10, 200, 5)
    assert out["median_decode_step_ms"] == pytest.approx(1.5)  # between the two halves
    assert out["decode_over_median"]["p10"] == pytest.approx(1 / 1.5, abs=1e-3)
    assert out["decode_over_median"]["p90"] == pytest.approx(2 / 1.5, abs=1e-3)
    assert out["decode_log_sd"] == pytest.approx(0.5 * 0.6931, abs=1e-3)  # half of log 2
    lags = {a["lag_steps"]: a["r"] for a in out["autocorrelation"]}
    assert lags[1] == pytest.approx(1.0, abs=0.02)  # a step is like the one before it
    assert lags[100] == pytest.approx(-1.0, abs=0.02)  # half the run away: the other half
    assert out["autocorrelation"][0]["lag_ms"] == pytest.approx(1.5)
    assert out["request_mean_log_sd"] == pytest.approx(0.5 * 0.6931, abs=1e-3)


def test_steps_that_vary_at_random_do_not_persist_and_average_out_over_a_request():
    import random

    rng = random.Random(1)
    requests = [
        {"decode": [0.001 * rng.lognormvariate(0, 0.2) for _ in range(100)], "drafting_steps": 0}
        for _ in range(2)
    ]
    out = noise(requests)
    assert out["decode_log_sd"] == pytest.approx(0.2, abs=0.03)
    assert abs(next(a["r"] for a in out["autocorrelation"] if a["lag_steps"] == 1)) < 0.2
    assert out["request_mean_log_sd"] < 0.05  # two requests' means, each over 100 draws


def test_the_spread_is_given_again_window_by_window():
    from bench.step_noise import WINDOW

    calm = [{"decode": [0.001] * 10, "drafting_steps": 0}] * WINDOW
    wild = [{"decode": [0.001 * (1 + i % 2)] * 10, "drafting_steps": 0} for i in range(WINDOW)]
    windows = noise(calm + wild + calm[:5])["by_window"]  # the last five make no window
    assert [w["requests"] for w in windows] == [f"1-{WINDOW}", f"{WINDOW + 1}-{2 * WINDOW}"]
    assert windows[0]["decode_log_sd"] == 0.0 and windows[0]["request_mean_log_sd"] == 0.0
    assert windows[1]["request_mean_log_sd"] == pytest.approx(0.5 * 0.6931, abs=1e-3)
