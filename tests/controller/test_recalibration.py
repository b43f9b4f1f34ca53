"""Closed-loop recalibration decisions (controller/recalibration.py) on synthetic rounds."""

from __future__ import annotations

import math
import random

import pytest

from controller.recalibration import (
    CalibrationPool,
    DriftWatch,
    ObservedRound,
    TableRefresh,
    raw_logits,
    refit,
)

GAMMA = 4


def sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def workload(shift: float, in_force: list[float], rounds: int, seed: int = 0) -> list[ObservedRound]:
    """Rounds whose true acceptance of slot k is sigmoid(z_k) while the confidence head says z_k * shift
    (a workload that makes the head overconfident by `shift`); the engine applies `in_force`."""
    rng = random.Random(seed)
    out = []
    for _ in range(rounds):
        z = [rng.gauss(0.8, 1.5) for _ in range(GAMMA)]
        accepted = 0
        while accepted < GAMMA and rng.random() < sigmoid(z[accepted]):
            accepted += 1
        surv, a = [], 1.0
        for k in range(GAMMA):
            a *= sigmoid(z[k] * shift / in_force[k])
            surv.append(a)
        out.append(ObservedRound(tuple(surv), accepted, temperature=0.8))
    return out


def test_raw_logits_invert_the_survivals_the_engine_computed():
    logits, temps = [1.5, -0.3, 2.0], [0.7, 1.3, 2.2]
    surv, a = [], 1.0
    for z, t in zip(logits, temps):
        a *= sigmoid(z / t)
        surv.append(a)
    assert raw_logits(surv, temps) == pytest.approx(logits, abs=1e-9)


def test_drift_is_detected_and_the_refit_corrects_it():
    in_force = [1.0] * GAMMA
    pool = CalibrationPool()
    pool.add(workload(3.0, in_force, 300, seed=1))
    pool.add(workload(3.0, in_force, 300, seed=2))  # a second replica: rounds are pooled
    assert pool.temperatures() == [0.8]
    result = refit(pool.rounds(0.8), in_force)
    assert result is not None and result.rounds == 600 and result.temperature == 0.8
    assert result.ece_before > 0.1 and result.ece_after < 0.05
    assert result.temperatures[0] == pytest.approx(3.0, rel=0.25)
    # Served with the refitted temperatures, the same workload is calibrated: nothing more to do.
    assert refit(workload(3.0, result.temperatures, 600, seed=3), result.temperatures) is None


def test_calibrated_confidences_and_thin_evidence_are_left_alone():
    in_force = [1.0] * GAMMA
    assert refit(workload(1.0, in_force, 600), in_force) is None
    assert refit(workload(3.0, in_force, 50), in_force, min_rounds=200) is None


def test_pool_is_bounded_and_cleared_per_temperature():
    pool = CalibrationPool(max_rounds=10)
    pool.add(workload(1.0, [1.0] * GAMMA, 25))
    assert len(pool.rounds(0.8)) == 10
    pool.clear(0.8)
    assert pool.rounds(0.8) == []


def test_a_table_is_refreshed_only_after_drift_on_one_side_for_several_windows():
    watch = DriftWatch(band=0.15, windows=3)
    assert [watch.observe("r", s) for s in (1.3, 1.4)] == [None, None]
    assert watch.observe("r", 1.35) == TableRefresh("r", 1.35)
    assert [watch.observe("r", s) for s in (1.3, 0.7, 1.3)] == [None] * 3  # both sides: noise
    assert [watch.observe("r", s) for s in (1.1, 1.05, 0.95)] == [None] * 3  # inside the band
    assert [watch.observe("r", s) for s in (0.6, 0.62)] == [None, None]
    assert watch.observe("r", 0.61) == TableRefresh("r", 0.61)  # faster than the table: rescaled up
