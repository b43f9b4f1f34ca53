"""The controller's throughput model (controller/model.py): the step-time curve it plans with, and that
its plan has no cliff: over a fine load sweep the drafts per request it allows never rise with load, and
the throughput it predicts moves by at most one request's share between adjacent loads. The model before
this one (rates interpolated linearly, argmax over a multimodal Θ) fails these: its cap at α = 0.8 went
264 -> 542 tokens between 200 and 220 requests, and its best throughput fell with load at α = 0.6."""

from __future__ import annotations

import pytest
from synthetic_telemetry import TABLE, WINDOW

from controller import model
from dspark.cost_table import CostTable

# Measured-looking tables with steps (wave quantisation) and a rate that rises once (noise): the shapes
# that made the old argmax jump.
JAGGED = ((1, 100.0), (16, 99.0), (32, 80.0), (48, 79.0), (64, 55.0), (96, 54.0), (128, 30.0), (512, 9.0))
NOISY = ((1, 60.0), (64, 59.0), (128, 56.0), (192, 57.5), (256, 45.0), (512, 28.0), (1024, 15.0), (2048, 7.0))
LOADS = range(1, 401)


def test_the_step_time_starts_at_the_table_and_extends_along_its_last_slope():
    curve = model.SpsCurve.of(((1, 50.0), (100, 40.0), (200, 20.0)))
    assert curve(1) == curve(0) == 50.0
    assert curve.knots[0] == (1.0, 0.02) and curve.knots[-1][0] == 200.0
    assert curve.last_slope > 0
    assert curve.step_time(300) == pytest.approx(curve.step_time(200) + 100 * curve.last_slope)
    slower = model.SpsCurve.of(((1, 50.0), (100, 40.0), (200, 20.0)), slowdown=2.0)
    assert slower.step_time(150) == pytest.approx(2 * curve.step_time(150))


def test_one_table_and_slowdown_give_one_curve_built_once():
    # Every period asks for every replica's curve; replicas of one kind publish one table.
    curve = model.SpsCurve.of(JAGGED, slowdown=1.3)
    assert model.SpsCurve.of([list(p) for p in JAGGED], slowdown=1.3) is curve  # the stats' list form
    assert model.SpsCurve.of(JAGGED, slowdown=1.2) is not curve
    fresh = model.SpsCurve([b for b, _ in JAGGED], [r for _, r in JAGGED], 1.3)
    assert fresh.knots == curve.knots and fresh.last_slope == curve.last_slope
    with pytest.raises(ValueError, match="ascending"):  # a bad table is refused every time, not remembered
        model.SpsCurve.of(((2, 50.0), (1, 40.0)))
    with pytest.raises(ValueError, match="ascending"):
        model.SpsCurve.of(((2, 50.0), (1, 40.0)))


def test_a_dent_or_a_superlinear_segment_is_bridged_from_below():
    dented = model.SpsCurve.of(((1, 50.0), (100, 25.0), (200, 20.0)))  # 100 sits above the chord 1 .. 200
    assert dented.step_time(100) < 1 / 25.0
    # 400 tokens in four times the time of 200: splitting the forward would be faster.
    split = model.SpsCurve.of(((1, 50.0), (200, 20.0), (400, 5.0)))
    assert split.step_time(400) <= 2 * split.step_time(200) + 1e-15 < 1 / 5.0


@pytest.mark.parametrize("table", [TABLE, JAGGED, NOISY], ids=["synthetic", "jagged", "noisy"])
def test_the_step_time_is_non_decreasing_convex_and_never_longer_per_token(table):
    curve = model.SpsCurve.of(table, slowdown=1.3)
    t = [curve.step_time(b) for b in range(1, 4097)]
    assert all(b >= a - 1e-15 for a, b in zip(t, t[1:]))
    assert all(t[i + 1] - t[i] >= t[i] - t[i - 1] - 1e-12 for i in range(1, len(t) - 1))
    assert all(t[i + 1] / (i + 2) <= t[i] / (i + 1) + 1e-15 for i in range(len(t) - 1))
    engine = CostTable([b for b, _ in table], [r for _, r in table], max_tokens=table[-1][0])
    assert all(curve.step_time(b) <= 1.3 / engine(b) + 1e-15 for b in range(1, table[-1][0] + 1))


@pytest.mark.parametrize("alpha", [0.4, 0.6, 0.8, 0.9])
@pytest.mark.parametrize("table", [TABLE, JAGGED, NOISY], ids=["synthetic", "jagged", "noisy"])
def test_no_cliff_over_a_fine_load_sweep(table, alpha):
    sps = model.SpsCurve.of(table)
    plans = [model.plan_step(n, [alpha] * WINDOW, sps, slack=0.02) for n in LOADS]
    for a, b in zip(plans, plans[1:]):
        r = a.num_requests
        # The budget per request never rises with load, at the optimum and at the cap.
        assert b.cap_depth <= a.cap_depth + 1e-12
        assert b.best_drafts / (r + 1) <= a.best_drafts / r + 1e-12
        # One more request adds at most its own share to the step cap, plus the token lost to rounding ...
        assert b.cap_drafts <= a.cap_drafts + a.cap_depth + 1
        assert r * a.cap_depth - 1 - 1e-9 <= a.cap_drafts <= r * a.cap_depth + 1e-9
        # ... and to the predicted throughput, which never falls as load rises.
        assert a.best_throughput <= b.best_throughput * (1 + 1e-12)
        assert b.best_throughput <= a.best_throughput * (1 + 1 / r) * (1 + 1e-12)
    assert plans[0].unconstrained and plans[0].cap_depth == WINDOW  # light load: spend it on latency
    assert plans[-1].cap_depth < plans[0].cap_depth  # heavy load: shrink toward throughput
