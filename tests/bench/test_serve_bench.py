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


def test_the_table_names_the_load_generator_and_states_its_cost_per_point():
    from bench.serve import table

    offline = {"method": "offline", "concurrency": 1, "tok_s_user": 100.0, "tok_s_total": 100.0}
    offline |= {"ttft_s": 0.02, "messages_per_token": 0.0, "cpu_ms_per_token_offline": 8.0}
    grpc = {"method": "grpc", "concurrency": 1, "tok_s_user": 95.0, "tok_s_total": 95.0, "ttft_s": 0.03}
    grpc |= {"messages_per_token": 0.3, "cpu_ms_per_token_proxy": 0.0, "cpu_ms_per_token_ingress": 0.5}
    grpc |= {
        "cpu_ms_per_token_replica": 9.0,
        "client_cpu_us_per_token": 512.4,
        "client_wakeups_per_token": 8.9,
    }
    text = table({"config": {"client": "async"}, "points": [offline, grpc], "summary": {}})
    assert text.startswith("Load generator: `async` clients")
    assert (
        text.splitlines()[-1]
        == "| 1 | grpc | 95.0 | 95.0 | 0.030 | -5.0% | 0.300 | 0.00, 0.50, 9.00 | 512, 8.90 |"
    )
    assert "| engine 8.00 | - |" in text  # a result without the load generator's cost (older ones) says so
