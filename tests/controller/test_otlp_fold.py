"""The fold of received OTLP spans and points into per-replica measurements, and their merge over the
broadcast snapshot: exact values from hand-made spans and points (the receiver's own dataclasses)."""

from __future__ import annotations

import pytest
from synthetic_telemetry import snap

from controller.otlp import METRIC_CALIBRATION, Measured, OtlpFold, merge
from controller.telemetry import ClassStats
from dspark.telemetry import semconv as sc
from dspark.telemetry.metrics import CALIBRATION_ERROR
from dspark.telemetry.receiver import ReceivedPoint, ReceivedSpan

REPLICA = {sc.ROLE: "replica", sc.REPLICA_ID: "r0"}


def request_span(cls: str, ttft: float, tpot: float, steps=(), resource=REPLICA) -> ReceivedSpan:
    events = [
        (sc.STEP_EVENT, 0, {sc.STEP_INDEX: i, sc.STEP_MEASURED_FORWARD: m, sc.STEP_PREDICTED_FORWARD: p})
        for i, m, p in steps
    ]
    attrs = {sc.SLA_CLASS: cls, sc.TIME_TO_FIRST_TOKEN: ttft, sc.TIME_PER_OUTPUT_TOKEN: tpot}
    return ReceivedSpan(
        "text_completion target", "0" * 32, "1" * 16, "", "INTERNAL", 0, 1, attrs, events, 0, resource
    )


def histogram(metric: str, cls: str, count: int, total: float, rid: str = "r0") -> ReceivedPoint:
    return ReceivedPoint(
        metric, "histogram", {sc.SLA_CLASS: cls}, None, count, total, [], {**REPLICA, sc.REPLICA_ID: rid}
    )


def test_the_exported_names_are_the_replicas():
    assert METRIC_CALIBRATION == CALIBRATION_ERROR.name


def test_span_percentiles_per_class_and_step_slowdown_counted_once():
    fold = OtlpFold(percentile=0.9)
    # Ten chat requests with TPOT 0.01 .. 0.10: the nearest-rank p90 is the 9th, 0.09.
    fold.add_spans(request_span("chat", 0.1 * i, 0.01 * i) for i in range(1, 11))
    # Step 7 served two requests: both carry its event, and it counts once.
    fold.add_spans([request_span("batch", 0.5, 0.2, steps=[(7, 0.03, 0.02), (8, 0.05, 0.02)])])
    fold.add_spans([request_span("batch", 0.7, 0.4, steps=[(7, 0.03, 0.02)])])
    # The ingress's spans of the same requests never count.
    fold.add_spans([request_span("chat", 99.0, 99.0, resource={sc.ROLE: "ingress", sc.REPLICA_ID: "i0"})])
    measured = fold.window()
    assert set(measured) == {"r0"}
    m = measured["r0"]
    assert m.tpot_s["chat"] == pytest.approx(0.09)
    assert m.ttft_s["chat"] == pytest.approx(0.9)
    assert m.tpot_s["batch"] == pytest.approx(0.4)  # p90 of two: the larger
    assert m.forward_slowdown == pytest.approx((0.03 + 0.05) / (0.02 + 0.02))
    assert (m.steps, m.requests) == (2, 12)
    assert fold.window() == {}  # the next period starts empty


def test_cumulative_histograms_give_the_mean_of_the_period():
    fold = OtlpFold()
    fold.add_points([histogram(sc.TPOT, "batch", 4, 0.4)])
    assert fold.window()["r0"].tpot_s == {"batch": pytest.approx(0.1)}
    # Re-exported unchanged: nothing new in this period. Then 2 more requests taking 0.6 s per token.
    fold.add_points([histogram(sc.TPOT, "batch", 4, 0.4)])
    assert fold.window()["r0"].tpot_s == {}
    fold.add_points([histogram(sc.TPOT, "batch", 5, 0.7), histogram(sc.TPOT, "batch", 6, 1.6)])
    assert fold.window()["r0"].tpot_s == {"batch": pytest.approx((1.6 - 0.4) / 2)}
    # The replica's process restarted: its counts start again from zero.
    fold.add_points([histogram(sc.TPOT, "batch", 1, 0.05)])
    assert fold.window()["r0"].tpot_s == {"batch": pytest.approx(0.05)}


def test_spans_win_over_histograms_and_the_calibration_gauge_is_the_latest():
    fold = OtlpFold()
    fold.add_points([histogram(sc.TPOT, "chat", 3, 3.0)])
    fold.add_spans([request_span("chat", 0.2, 0.02)])
    gauge = lambda v: ReceivedPoint(METRIC_CALIBRATION, "gauge", {sc.REPLICA_ID: "r0"}, v, resource=REPLICA)  # noqa: E731
    fold.add_points([gauge(0.2), gauge(0.07)])
    m = fold.window()["r0"]
    assert m.tpot_s == {"chat": 0.02}
    assert m.calibration_error == 0.07


def test_merge_lays_the_export_over_the_snapshot():
    base = snap(8, 0.0, classes={"chat": ClassStats(running=3, tpot_s=0.5), "batch": ClassStats(running=5)})
    merged = merge(
        base,
        Measured(ttft_s={"chat": 0.3}, tpot_s={"batch": 0.04}, calibration_error=0.12, forward_slowdown=1.4),
    )
    assert merged.classes["chat"] == ClassStats(running=3, ttft_s=0.3, tpot_s=0.5)
    assert merged.classes["batch"] == ClassStats(running=5, tpot_s=0.04)
    assert (merged.calibration_error, merged.forward_slowdown) == (0.12, 1.4)
    assert (merged.running, merged.acceptance, merged.taken_at) == (
        base.running,
        base.acceptance,
        base.taken_at,
    )
    # Nothing measured keeps the snapshot's own values.
    assert merge(base, Measured()) == base
    assert merge(base, None) is base
