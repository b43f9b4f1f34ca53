"""bench/gpu_measure.py (its CPU dry run; scripts/gpu_profile.sh runs it on a GPU) and bench/gpu_profile.py:
the simulator's profile derived from a measurement."""

from __future__ import annotations

import json

import pytest

from bench import gpu_measure, gpu_profile
from dspark.cost_table import CostTable
from sim import profiles
from sim.step_fit import EngineRun


def point(concurrency, steps, rounds, forward_tokens, drafted=0, step_s=1.0, draft_s=0.0, prompt=32):
    return dict(
        concurrency=concurrency,
        prompt_tokens=prompt,
        steps=steps,
        rounds=rounds,
        forward_tokens=forward_tokens,
        drafted_tokens=drafted,
        step_time_s=step_s,
        draft_time_s=draft_s,
    )


def test_a_window_with_prefill_in_it_is_not_a_decode_point():
    assert gpu_profile.decode_only(point(4, 10, 40, 40))  # plain: 4 requests, 1 token each, every step
    assert gpu_profile.decode_only(point(4, 10, 40, 320, drafted=280))  # 7 drafts + anchor each
    assert not gpu_profile.decode_only(point(4, 10, 40, 41))  # a prefill chunk rode along
    assert not gpu_profile.decode_only(point(4, 10, 37, 37))  # some requests were still prefilling
    assert not gpu_profile.decode_only(point(4, 0, 0, 0))


def test_step_terms_are_recovered_where_the_runs_tell_them_apart_and_fall_back_where_not():
    table = CostTable([1, 8, 64], [100.0, 80.0, 20.0], 64)
    truth = dict(forward_scale=0.8, step_overhead_s=0.002, request_overhead_s=0.0005, token_overhead_s=0.0001)

    def run(tokens, requests):
        per_step = (
            truth["forward_scale"] / table(tokens)
            + truth["step_overhead_s"]
            + requests * truth["request_overhead_s"]
            + tokens * truth["token_overhead_s"]
        )
        return EngineRun(steps=10, forward_tokens=10 * tokens, rounds=10 * requests, cpu_s=10 * per_step)

    terms, how = gpu_profile.fit_steps([run(1, 1), run(8, 8), run(64, 8), run(32, 32), run(64, 64)], table)
    assert how == "four terms"
    assert terms == pytest.approx(truth, rel=1e-6)

    flat = CostTable([1, 64], [50.0, 50.0], 64)  # host-bound: the forward costs the same at every size
    runs = [EngineRun(10, 10 * n, 10 * n, cpu_s=10 * (0.02 + 0.03)) for n in (1, 4, 16)]
    terms, how = gpu_profile.fit_steps(runs, flat)
    assert how.startswith("the table flat")
    assert terms["forward_scale"] == 1.0 and terms["step_overhead_s"] == pytest.approx(0.03)


def test_kv_pages_are_what_the_memory_fraction_holds_beside_the_weights_and_activations():
    measurement = {
        "hardware": {"memory_bytes": 100_000},
        "settings": {"kv_pages": 10},
        "kv_bytes_per_token": 10,
        "peak_memory_bytes_drafting": 10 * 4 * 10 + 5_000,  # the allocated KV (10 pages of 4) + the rest
    }
    assert gpu_profile.kv_pages(measurement, page_size=4) == (90_000 - 5_000) // 40


def test_a_measurement_on_the_cpu_becomes_a_profile_the_simulator_loads(tmp_path):
    out = tmp_path / "measurement.json"
    argv = ["--shape", "tiny", "--device", "cpu", "--dtype", "float32", "--quick", "--prompt-tokens", "24"]
    argv += [
        "--concurrency",
        "1",
        "3",
        "--long-concurrency",
        "2",
        "--long-prompt-tokens",
        "96",
        "--steps",
        "3",
    ]
    argv += ["--max-num-seqs", "8", "--max-num-batched-tokens", "64", "--kv-pages", "256", "--out", str(out)]
    assert gpu_measure.main(argv) == 0
    measurement = json.loads(out.read_text())
    assert [p["concurrency"] for p in measurement["draft_sweep"]] == [1, 3]
    assert [(p["concurrency"], p["prompt_tokens"]) for p in measurement["engine_sweep"]] == [
        (1, 24),
        (3, 24),
        (2, 96),
    ]
    # The window starts once every request decodes (96-token prompts at 64 tokens a step need chunks).
    sweeps = measurement["draft_sweep"] + measurement["engine_sweep"]
    assert all(gpu_profile.decode_only(p) for p in sweeps)
    assert all(p["drafted_tokens"] == 7 * p["rounds"] for p in measurement["draft_sweep"])
    profile = gpu_profile.derive(measurement, profiles.load("gpu_dsv4flash_rocm"), "tiny_cpu", str(out))
    loaded = profiles.from_dict(profile)
    assert loaded.sps_points[0] == 1 and loaded.max_num_batched_tokens == 64 and loaded.gamma == 7
    assert loaded.draft_s_per_step + loaded.draft_s_per_request > 0
    assert loaded.acceptance == profiles.load("gpu_dsv4flash_rocm").acceptance


def test_the_committed_h200_profile_is_what_its_measurement_derives():
    measured = gpu_profile.REPO / "bench" / "results" / "gpu_measurement_qwen3-4b.json"
    committed = json.loads((profiles.PROFILE_DIR / "gpu_h200_ours_qwen3_4b.json").read_text())
    derived = gpu_profile.derive(
        json.loads(measured.read_text()),
        profiles.load("gpu_dsv4flash_rocm"),
        committed["name"],
        "bench/results/gpu_measurement_qwen3-4b.json",
    )
    assert derived == committed
