"""bench/serve.py: the noise band it states beside the serving overheads."""

from __future__ import annotations

from bench.serve import noise_band


def test_the_noise_band_is_the_widest_spread_of_one_methods_repeats_per_concurrency():
    points = [
        {"method": "offline", "concurrency": 1, "tok_s_user_each": [100.0, 104.0]},
        {"method": "http", "concurrency": 1, "tok_s_user_each": [90.0, 99.0]},  # the widest at c1: 10%
        {"method": "offline", "concurrency": 8, "tok_s_user_each": [50.0, 50.5, 51.0]},
        {"method": "grpc", "concurrency": 8, "tok_s_user_each": [40.0, 40.0]},
    ]
    assert noise_band(points) == {"c1": 0.1, "c8": 0.02}


def test_a_single_repeat_states_no_band():
    assert noise_band([{"method": "offline", "concurrency": 1, "tok_s_user_each": [100.0]}]) == {}
