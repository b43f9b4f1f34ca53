"""The routing benchmark's load and scoring: seeded schedules, SLA attainment, goodput, percentiles."""

from __future__ import annotations

import pytest

from bench.route_workload import (
    Arrival,
    Lengths,
    Outcome,
    SlaTarget,
    arm_order,
    engine_kind,
    expected_kinds,
    goodput,
    goodput_interpolated,
    kinds_problem,
    mean_points,
    met,
    noise_band,
    paired_ratios,
    percentile,
    schedule,
    score,
    setting_engines,
    spread,
)

FAST = SlaTarget("interactive", 0.5, ttft_s=1.0, tpot_s=0.02)
SLOW = SlaTarget("batch", 0.5, ttft_s=20.0, tpot_s=1.0)
PROMPT = Lengths(64, 0.6, 4, 256)
OUTPUT = Lengths(32, 0.6, 2, 128)


def test_a_schedule_is_fixed_by_its_seed_and_follows_the_rate_shares_and_bounds():
    one = schedule(20.0, 50.0, [FAST, SLOW], PROMPT, OUTPUT, seed=7)
    assert one == schedule(20.0, 50.0, [FAST, SLOW], PROMPT, OUTPUT, seed=7)
    assert one != schedule(20.0, 50.0, [FAST, SLOW], PROMPT, OUTPUT, seed=8)
    assert 900 <= len(one) <= 1100  # Poisson: 1000 expected, sd ~32
    assert all(a.at_s < b.at_s for a, b in zip(one, one[1:])) and one[-1].at_s < 50.0
    interactive = sum(a.sla_class == "interactive" for a in one) / len(one)
    assert 0.45 <= interactive <= 0.55
    assert all(4 <= a.prompt_tokens <= 256 and 2 <= a.max_tokens <= 128 for a in one)
    prompts = sorted(a.prompt_tokens for a in one)
    assert 58 <= prompts[len(prompts) // 2] <= 70  # the log-normal's median


def test_a_request_meets_its_sla_only_when_it_completed_within_both_targets():
    arrival = Arrival(0.0, "interactive", 10, 10)
    assert met(Outcome(arrival, "ok", ttft_s=0.5, tpot_s=0.02, tokens=10), FAST)
    assert not met(Outcome(arrival, "ok", ttft_s=1.01, tpot_s=0.01, tokens=10), FAST)
    assert not met(Outcome(arrival, "ok", ttft_s=0.5, tpot_s=0.021, tokens=10), FAST)
    assert met(Outcome(arrival, "ok", ttft_s=0.5, tpot_s=None, tokens=1), FAST)  # one token: no TPOT
    assert not met(Outcome(arrival, "refused"), FAST) and not met(Outcome(arrival, "error"), FAST)


def test_score_counts_refusals_as_missed_and_reports_latencies_of_completed_requests():
    fast, slow = Arrival(0.0, "interactive", 10, 10), Arrival(0.1, "batch", 10, 10)
    outcomes = [
        Outcome(fast, "ok", 0.1, 0.010, 10),
        Outcome(fast, "ok", 0.3, 0.030, 10),  # TPOT missed
        Outcome(fast, "refused"),
        Outcome(slow, "ok", 2.0, 0.5, 10),
        Outcome(slow, "error"),
    ]
    point = score(outcomes, [FAST, SLOW], window_s=2.0)
    assert point["sent"] == 5 and point["attainment"] == 0.4 and point["met_rps"] == 1.0
    assert point["attainment_by_class"] == {"interactive": pytest.approx(1 / 3, abs=1e-4), "batch": 0.5}
    assert (point["refused"], point["errors"]) == (1, 1)
    assert point["ttft_p50_ms"] == 300.0 and point["tpot_p50_ms"] == 30.0
    assert point["ttft_p99_ms"] == pytest.approx(1000 * (0.3 + 0.98 * 1.7))


def test_percentile_interpolates_between_ranks():
    assert percentile([], 50) is None
    assert percentile([3.0], 99) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([4.0, 1.0, 3.0, 2.0], 100) == 4.0


def test_goodput_is_the_best_met_rate_at_90_percent_attainment():
    points = [
        {"attainment": 1.0, "met_rps": 2.0},
        {"attainment": 0.92, "met_rps": 3.6},
        {"attainment": 0.85, "met_rps": 4.0},  # more met per second, but below the bar
    ]
    assert goodput(points) == 3.6
    assert goodput([{"attainment": 0.5, "met_rps": 4.0}, {"attainment": None, "met_rps": 0.0}]) == 0.0


def test_interpolated_goodput_is_the_met_rate_where_attainment_crosses_the_bar():
    def point(rate: float, attainment: float, met: float) -> dict:
        return {"rate_rps": rate, "attainment": attainment, "met_rps": met}

    # bench/results/route.json (heterogeneous, before this change): pow2 crosses just past 7.26 req/s,
    # the SLA router well before it; the step goodput made that 6.8 against 5.27 (0.775x).
    pow2 = [
        point(2.906, 1.0, 2.2667),
        point(5.085, 1.0, 5.2667),
        point(7.264, 0.9228, 6.8),
        point(10.17, 0.6798, 6.8667),
    ]
    sla = [
        point(2.906, 1.0, 2.2667),
        point(5.085, 1.0, 5.2667),
        point(7.264, 0.868, 6.4),
        point(10.17, 0.693, 7.0),
    ]
    assert goodput_interpolated(pow2) == round(6.8 + 0.0228 / 0.243 * 0.0667, 4) == 6.8063
    assert goodput_interpolated(sla) == round(5.2667 + 0.1 / 0.132 * 1.1333, 4) == 6.1253
    assert goodput_interpolated(list(reversed(sla))) == 6.1253  # by rate, whatever the order
    assert goodput_interpolated([point(1.0, 0.95, 0.9), point(2.0, 0.91, 1.8)]) == 1.8  # never below
    assert goodput_interpolated([point(1.0, 0.5, 0.5), point(2.0, 0.95, 1.9)]) == 0.0  # below at once


def test_repeats_are_averaged_per_load_point():
    a = [
        {"rate_rps": 2.0, "attainment": 1.0, "by": {"x": 1.0}, "p99": None},
        {"rate_rps": 4.0, "attainment": 0.5, "by": {"x": 0.0}, "p99": 9.0},
    ]
    b = [
        {"rate_rps": 2.0, "attainment": 0.8, "by": {"x": 0.5}, "p99": 5.0},
        {"rate_rps": 4.0, "attainment": 0.7, "by": {"x": 1.0}, "p99": 11.0},
    ]
    assert mean_points([a, b]) == [
        {"rate_rps": 2.0, "attainment": 0.9, "by": {"x": 0.75}, "p99": None},
        {"rate_rps": 4.0, "attainment": 0.6, "by": {"x": 0.5}, "p99": 10.0},
    ]


DRAFTER = {"drafter": "dspark", "num_speculative_tokens": 7, "scheduler": "fixed"}


def test_each_setting_gives_each_rank_its_engine():
    big = {**DRAFTER, "max_num_seqs": 8}
    assert setting_engines("heterogeneous", DRAFTER, 8, 2) == [big, {**DRAFTER, "max_num_seqs": 2}]
    assert setting_engines("uniform", DRAFTER, 8, 2) == [big, big]
    assert setting_engines("drafter_vs_plain", DRAFTER, 8, 2) == [big, {"drafter": "none", "max_num_seqs": 8}]
    with pytest.raises(ValueError, match="unknown setting 'mixed'"):
        setting_engines("mixed", DRAFTER, 8, 2)


def test_a_setting_whose_replicas_are_not_its_mix_is_refused():
    mixed = setting_engines("heterogeneous", DRAFTER, 8, 2)
    assert expected_kinds(mixed) == ["drafter x2", "drafter x8"]
    assert kinds_problem("heterogeneous", mixed, [engine_kind(True, 2), engine_kind(True, 8)]) is None
    # A pool caught mid-redeploy runs rank 0's engine twice.
    assert "got ['drafter x8', 'drafter x8']" in kinds_problem("heterogeneous", mixed, ["drafter x8"] * 2)
    plain = setting_engines("drafter_vs_plain", DRAFTER, 8, 2)
    assert kinds_problem("drafter_vs_plain", plain, ["plain x8", "drafter x8"]) is None
    assert kinds_problem("uniform", setting_engines("uniform", DRAFTER, 8, 2), ["drafter x8", "plain x8"])


def test_arms_take_turns_with_pow2_first_then_last():
    arms = ["sla", "round_robin", "pow2"]
    assert arm_order(arms, 0) == ["pow2", "round_robin", "sla"]
    assert arm_order(arms, 1) == ["sla", "round_robin", "pow2"]
    assert arm_order(arms, 2) == ["pow2", "round_robin", "sla"]


def test_the_noise_band_is_the_widest_spread_of_identical_repeats_at_any_load_point():
    repeats = [
        [{"met_rps": 5.0}, {"met_rps": 8.0}],
        [{"met_rps": 5.0}, {"met_rps": 6.0}],
        [{"met_rps": 5.0}, {"met_rps": 7.0}],
    ]
    assert spread([8.0, 6.0, 7.0]) == round(2.0 / 7.0, 4)
    assert noise_band(repeats) == round(2.0 / 7.0, 4)
    assert spread([3.0]) is None and spread([0.0, 0.0]) is None
    assert noise_band([[{"met_rps": 0.0}], [{"met_rps": 0.0}]]) is None


def test_paired_ratios_compare_repeat_by_repeat_and_skip_a_zero_base():
    assert paired_ratios([8.0, 6.0, 3.0], [4.0, 0.0, 6.0]) == [2.0, None, 0.5]
