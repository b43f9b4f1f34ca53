"""The machine's speed wander (sim/noise.py): its law, its place in the cluster, its fit to a measurement."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest

from bench.cost_profile import STEP_NOISE, noise_block
from bench.step_noise import fit
from sim.host import HostCost
from sim.noise import StepNoise, Wander
from sim.profiles import load
from tests.sim.test_simulator import simulate, small_profile

NOISE = StepNoise(slow_log_sd=0.2, correlation_s=0.5, white_log_sd=0.1)


def sampled(noise: StepNoise, times: np.ndarray, seed: int = 0) -> np.ndarray:
    wander = Wander(noise, random.Random(seed))
    return np.array([wander.factor(t) for t in times])


def test_the_multiplier_has_mean_one_and_the_measured_spread_and_memory():
    times = np.arange(0, 4000, 0.05)  # 80,000 samples 50 ms apart over 8,000 correlation times
    factors = sampled(NOISE, times)
    logs = np.log(factors)
    assert factors.mean() == pytest.approx(1.0, abs=0.01)
    assert logs.std() == pytest.approx(math.hypot(0.2, 0.1), rel=0.03)
    centred = logs - logs.mean()
    for lag_steps in (1, 10):  # lag 0.05 s and 0.5 s: only the slow part carries over
        r = np.dot(centred[:-lag_steps], centred[lag_steps:]) / np.dot(centred, centred)
        expected = 0.2**2 / (0.2**2 + 0.1**2) * math.exp(-0.05 * lag_steps / 0.5)
        assert r == pytest.approx(expected, abs=0.03)


def test_the_wander_is_seeded_and_samples_at_any_gap():
    times = np.cumsum(random.Random(1).choices([0.0, 1e-4, 0.01, 3.0], k=500))
    assert np.array_equal(sampled(NOISE, times, seed=4), sampled(NOISE, times, seed=4))
    assert not np.array_equal(sampled(NOISE, times, seed=4), sampled(NOISE, times, seed=5))
    quiet = StepNoise(slow_log_sd=0.0, correlation_s=1.0)
    assert set(sampled(quiet, times)) == {1.0}


@pytest.mark.parametrize("bad", [dict(slow_log_sd=-0.1), dict(correlation_s=0.0), dict(white_log_sd=-1.0)])
def test_a_wander_needs_sds_of_at_least_zero_and_a_positive_memory(bad):
    with pytest.raises(ValueError, match="step_noise"):
        StepNoise(**({"slow_log_sd": 0.1, "correlation_s": 0.5} | bad))


def test_in_the_cluster_the_steps_wander_and_nothing_is_lost():
    plain, plain_requests = simulate(profile=small_profile())
    noisy, noisy_requests = simulate(profile=small_profile(step_noise=NOISE))
    _, again = simulate(profile=small_profile(step_noise=NOISE))
    for requests in (plain_requests, noisy_requests):
        assert {r.outcome for r in requests} <= {"done", "shed", "refused"}
        assert all(r.generated == r.max_tokens for r in requests if r.outcome == "done")
    # Seeded: the same run twice is the same run; the wander moves when steps end.
    assert [r.finish for r in noisy_requests] == [r.finish for r in again]
    assert [r.finish for r in noisy_requests] != [r.finish for r in plain_requests]

    def mean_step(cluster) -> float:
        replicas = cluster.all_replicas()
        return sum(r.counters.alone_time_s for r in replicas) / sum(r.counters.steps for r in replicas)

    assert mean_step(noisy) == pytest.approx(mean_step(plain), rel=0.15)  # mean one: the same cost on average
    assert len(noisy._wander) == 3  # no host block: each replica wanders on its own


def test_replicas_on_one_host_share_its_wander():
    hosted = small_profile(step_noise=NOISE, host=HostCost(cores=2, replicas=2))
    cluster, requests = simulate(profile=hosted)
    assert len(cluster._wander) == 2  # three replicas, two to a host: two hosts
    assert {r.outcome for r in requests} <= {"done", "shed", "refused"}


def test_the_measured_profile_carries_the_wander_fitted_to_the_committed_measurement():
    measurement = json.loads(STEP_NOISE.read_text())
    block = noise_block(measurement)
    assert json.loads(json.dumps(load("cpu_measured").step_noise.__dict__)) == {
        k: block[k] for k in ("slow_log_sd", "correlation_s", "white_log_sd")
    }
    assert "bench/step_noise.py" in block["source"] and measurement["started"] in block["source"]
    assert load("gpu_dsv4flash_rocm").step_noise is None  # the GPU class measured none: no wander


def test_the_fit_recovers_a_known_wander():
    times = np.arange(0, 600, 0.0033)  # steps of 3.3 ms, as the measurement's
    logs = np.log(sampled(NOISE, times, seed=2))
    centred = logs - logs.mean()
    autocorrelation = [
        {
            "lag_ms": round(lag * 3.3, 1),
            "r": float(np.dot(centred[:-lag], centred[lag:]) / np.dot(centred, centred)),
        }
        for lag in (1, 2, 5, 10, 20, 50, 100)
    ]
    fitted = fit({"decode_log_sd": float(logs.std()), "autocorrelation": autocorrelation})
    assert fitted["slow_log_sd"] == pytest.approx(0.2, rel=0.1)
    assert fitted["white_log_sd"] == pytest.approx(0.1, rel=0.15)
    assert fitted["correlation_s"] == pytest.approx(0.5, rel=0.25)
    with pytest.raises(ValueError, match="memory"):
        fit({"decode_log_sd": 0.1, "autocorrelation": [{"lag_ms": 1, "r": 0.5}, {"lag_ms": 2, "r": 0.6}]})


def test_a_sitting_derives_the_profile_with_its_own_step_noise():
    from bench.cost_profile import REPO, profile_from

    measurement = json.loads((REPO / "bench" / "results" / "serving_cost.json").read_text())
    quiet = {
        "command": "python bench/sim_validate.py --measure-profile (its step noise)",
        "started": "2026-12-06T15:00:00Z",
        "noise": {
            "decode_steps": 1000,
            "decode_log_sd": 0.08,
            "autocorrelation": [
                {"lag_ms": 3.0, "r": 0.7},
                {"lag_ms": 30.0, "r": 0.4},
                {"lag_ms": 300.0, "r": 0.2},
            ],
        },
    }
    block = profile_from(measurement, noise=quiet)["step_noise"]
    assert {k: block[k] for k in ("slow_log_sd", "white_log_sd", "correlation_s")} == fit(quiet["noise"])
    assert "2026-12-06T15:00:00Z" in block["source"]
