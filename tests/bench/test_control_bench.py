"""The controller benchmark's bookkeeping (bench/control.py): the seeded open-loop schedule, SLA outcomes,
per-phase summaries, settling times, the controller's cap changes and the noise band."""

from __future__ import annotations

from bench.control import NOISE_ARM, Outcome, cap_changes, noise_band, phase_summary, schedule, settle_periods

PHASES = [("light", 1.0, 10.0), ("heavy", 8.0, 10.0), ("light", 1.0, 10.0)]


def test_schedule_is_seeded_and_follows_the_ramp():
    arrivals = schedule(PHASES, seed=3)
    assert arrivals == schedule(PHASES, seed=3) != schedule(PHASES, seed=4)
    assert all(a <= b for (a, _, _), (b, _, _) in zip(arrivals, arrivals[1:]))
    per_phase = [sum(p == i for _, p, _ in arrivals) for i in range(3)]
    assert per_phase[1] > 3 * max(per_phase[0], per_phase[2])
    assert {c for _, _, c in arrivals} == {"interactive", "batch"}


def test_phase_summary_counts_sla_attainment_per_class():
    outcomes = [
        Outcome(0, "interactive", 0.0, ttft=0.5, seconds=3.0, tokens=11),  # tpot 0.25: met
        Outcome(0, "interactive", 1.0, ttft=3.0, seconds=4.0, tokens=11),  # ttft over 2 s: missed
        Outcome(0, "batch", 2.0, ttft=0.0, seconds=1.0, tokens=0, error="429"),
    ]
    s = phase_summary(outcomes, PHASES, 0)
    assert s["requests"] == 3 and s["errors"] == 1
    assert s["attainment"] == {"interactive": 0.5, "batch": 0.0}
    assert s["throughput_tok_s"] == 22 / 10.0


def test_settle_periods_count_from_each_step_to_the_last_change():
    """Counted like the policy's tests: periods from the step through the decision of the last change."""
    caps = lambda step: {"r": {"max_step_tokens": step}}  # noqa: E731
    trace = [
        {"t": 9.0, "period": 9, "caps": caps(None)},  # the last poll before the step at t = 10
        {"t": 10.5, "period": 10, "caps": caps(None)},  # decision 10, after the step: no change
        {"t": 11.5, "period": 11, "caps": caps(40)},
        {"t": 12.5, "period": 12, "caps": caps(12)},  # the last change: 3 periods after the step
        {"t": 13.5, "period": 13, "caps": caps(12)},
        {"t": 19.5, "period": 19, "caps": caps(12)},  # the last poll before the step at t = 20
        {"t": 20.5, "period": 20, "caps": caps(None)},  # changed by the first decision after it: 1
        {"t": 21.5, "period": 21, "caps": caps(None)},
    ]
    assert settle_periods(trace, PHASES) == [3, 1]
    held = [{**p, "caps": caps(None)} for p in trace]
    assert settle_periods(held, PHASES) == [0, 0]
    assert settle_periods(trace[1:5], PHASES) == [None, None]  # no poll before the first step


def test_cap_changes_count_moves_and_zero_means_the_defaults_were_kept():
    caps = lambda step: {"r": {"max_step_tokens": step}}  # noqa: E731
    held = {"trace": [{"t": t, "caps": caps(None)} for t in range(5)]}
    moved = {
        "trace": [{"t": 0, "caps": caps(None)}, {"t": 1, "caps": caps(12)}, {"t": 2, "caps": caps(None)}]
    }
    assert cap_changes([held, held]) == 0
    assert cap_changes([held, moved]) == 2
    assert cap_changes([{"trace": [{"t": 0, "caps": {}}, *held["trace"]]}]) == 0  # before its first period


def test_noise_band_is_the_largest_distance_between_the_identical_arms():
    row = lambda tput, inter: {"throughput_tok_s": tput, "attainment": {"interactive": inter, "batch": None}}  # noqa: E731
    arms = {
        "engine_only": [row(100.0, 1.0), row(400.0, 0.9)],
        NOISE_ARM: [row(95.0, 1.0), row(420.0, 0.8)],
    }
    band = noise_band(arms)
    assert abs(band["noise_band_throughput"] - 0.05) < 1e-12
    assert abs(band["noise_band_attainment"] - 0.1) < 1e-12
    assert noise_band({"engine_only": arms["engine_only"]}) == {}
