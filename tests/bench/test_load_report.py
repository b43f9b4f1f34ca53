"""The load benchmark's frontier math: Pareto sets, interpolation, matched-throughput and SLA anchors."""

from __future__ import annotations

import pytest

from bench.load_report import (
    matched_throughput_ratios,
    max_throughput_at,
    pareto_frontier,
    summarize,
    user_speed_at,
)


def test_pareto_frontier_drops_dominated_points_and_sorts_by_throughput() -> None:
    # (aggregate tok/s, tok/s/user) by concurrency; (250, 40) is beaten by (300, 50) on both axes.
    points = [(100, 100), (180, 90), (300, 50), (250, 40), (300, 45)]
    assert pareto_frontier(points) == [(100, 100), (180, 90), (300, 50)]


def test_user_speed_is_linear_between_points_and_undefined_outside() -> None:
    frontier = [(100.0, 100.0), (200.0, 80.0), (400.0, 40.0)]
    assert user_speed_at(frontier, 150) == pytest.approx(90)
    assert user_speed_at(frontier, 300) == pytest.approx(60)
    assert user_speed_at(frontier, 400) == 40
    assert user_speed_at(frontier, 99) is None
    assert user_speed_at(frontier, 401) is None
    assert user_speed_at([(10.0, 5.0)], 10) == 5


def test_matched_throughput_compares_only_inside_the_overlap() -> None:
    method = [(100.0, 200.0), (300.0, 150.0), (500.0, 100.0)]
    baseline = [(50.0, 100.0), (200.0, 80.0), (400.0, 40.0)]
    rows = matched_throughput_ratios(method, baseline)
    # Overlap 100..400: levels 100, 200 (baseline), 300, 400 (baseline).
    assert [r["tok_s_total"] for r in rows] == [100, 200, 300, 400]
    assert [r["ratio"] for r in rows] == pytest.approx(
        [200 / (100 - 20 * 50 / 150), 175 / 80, 150 / 60, 125 / 40]
    )
    assert matched_throughput_ratios(method, [(600.0, 10.0)]) == []


def test_sla_anchor_interpolates_where_the_frontier_crosses_it() -> None:
    points = [(100.0, 100.0), (200.0, 80.0), (400.0, 40.0)]
    assert max_throughput_at(points, 60) == {"tok_s_total": pytest.approx(300), "binding": True}
    assert max_throughput_at(points, 80) == {"tok_s_total": 200, "binding": True}
    assert max_throughput_at(points, 30) == {"tok_s_total": 400, "binding": False}
    assert max_throughput_at(points, 101) == {"tok_s_total": None, "binding": True}


def _points(method: str, rows: list[tuple[int, float, float, float]]) -> list[dict]:
    return [
        {"method": method, "concurrency": c, "tok_s_user": u, "tok_s_total": t, "mean_verify_tokens": v}
        for c, u, t, v in rows
    ]


def test_summary_and_targets_from_synthetic_points() -> None:
    points = (
        _points("plain", [(1, 100, 100, 0), (4, 90, 360, 0), (16, 60, 960, 0)])
        + _points("mtp1", [(1, 150, 150, 1), (4, 120, 480, 1), (16, 70, 1120, 1)])
        + _points("dspark_scheduled", [(1, 300, 300, 5), (4, 240, 960, 3), (16, 80, 1280, 0.5)])
        + [{"method": "hf_assisted", "concurrency": 1, "tok_s_user": 150, "tok_s_total": 140}]
    )
    code = {
        "plain": {"tok_s_user": 100.0, "mean_verify_tokens": 0.0},
        "dspark_scheduled": {"tok_s_user": 250.0, "mean_verify_tokens": 5.0},
    }
    s = summarize(points, code, anchor_factor=0.8, hf_plain={"tok_s_user": 120.0})
    matched = s["matched_throughput_speedup_vs_mtp1"]
    # Overlap 300..1120: dspark 300 vs mtp1 at 300 (interp 150->480: 135), ... , 1120 (dspark interp).
    assert [lv["tok_s_total"] for lv in matched["levels"]] == [300, 480, 960, 1120]
    assert matched["levels"][0]["ratio"] == pytest.approx(300 / (150 - 30 * 150 / 330), abs=1e-3)
    assert s["single_stream_speedup_vs_plain_code"] == 2.5
    assert s["speedup_vs_hf_assisted"] == 2.0
    # The peer at its best: assisted (150) beats generate without the assistant (120) here.
    assert s["transformers_best_c1"] == {"method": "assisted", "tok_s_user": 150}
    assert s["speedup_vs_transformers_best"] == 2.0
    slower = summarize(points, code, anchor_factor=0.8, hf_plain={"tok_s_user": 200.0})
    assert (
        slower["transformers_best_c1"]["method"] == "generate"
        and slower["speedup_vs_transformers_best"] == 1.5
    )
    assert summarize(points, code, anchor_factor=0.8)["transformers_best_c1"]["method"] == "assisted"
    sla = s["sla_anchor_throughput"]
    assert sla["anchor_tok_s_user"] == 80
    assert sla["by_method"]["dspark_scheduled"] == {"tok_s_total": 1280, "binding": False}
    assert sla["by_method"]["plain"]["tok_s_total"] == pytest.approx(360 + 600 * 10 / 30, abs=0.01)
    # Matched throughput, throughput vs plain, single stream on code, vs HF, verify budget shrinking.
    assert [t["result"] for t in s["targets"]] == ["pass"] * 5


def test_no_ratio_is_credited_to_drafting_that_was_off() -> None:
    """A scheduler that gated drafting off is plain decoding: its ratios are withheld, not reported."""
    points = (
        _points("plain", [(1, 100, 100, 0), (4, 90, 360, 0)])
        + _points("plain_repeat", [(1, 95, 95, 0), (4, 90, 378, 0)])
        + _points("mtp1", [(1, 150, 150, 1), (4, 120, 480, 1)])
        + _points("dspark_scheduled", [(1, 130, 130, 0.03), (4, 120, 470, 0.0)])
        + [{"method": "hf_assisted", "concurrency": 1, "tok_s_user": 100, "tok_s_total": 100}]
    )
    code = {
        "plain": {"tok_s_user": 100.0, "mean_verify_tokens": 0.0},
        "dspark_scheduled": {"tok_s_user": 130.0, "mean_verify_tokens": 0.03},
    }
    s = summarize(points, code, anchor_factor=0.8)
    assert s["credited"] == {"single_stream": False, "hf_assisted": False, "sla_anchor": False}
    assert s["single_stream_speedup_vs_plain_code"] is None and s["speedup_vs_hf_assisted"] is None
    assert s["matched_throughput_speedup_vs_mtp1"] is None
    assert s["sla_anchor_throughput"]["dspark_scheduled_over_mtp1"] is None
    assert s["noise_band_by_concurrency"] == {"1": 0.05, "4": 0.05} and s["noise_band"] == 0.05
    results = {t["target"]: t["result"] for t in s["targets"]}
    assert results["single stream >= 2x plain on code"] == "miss"
    assert results["dspark_scheduled verify budget per request shrinks with concurrency"] == "miss"
    # Faster than plain at every concurrency, but with drafting off: plain against plain, no pass.
    assert results["dspark_scheduled aggregate tok/s >= plain at every concurrency"] == "miss"
