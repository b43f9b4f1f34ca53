"""The controller's policy on synthetic telemetry (controller/policy.py)."""

from __future__ import annotations

import random

import pytest
from synthetic_telemetry import WINDOW, snap

from controller import model
from controller.decision import DEFAULTS, Caps, Reason
from controller.policy import Policy, PolicyConfig, SlaTarget
from controller.telemetry import ClassStats

PERIOD = 2.0


def run(policy: Policy, loads: list[int], start: int = 0, **kw) -> list:
    """One decision per period for one replica, the load of each period given."""
    out = []
    for i, load in enumerate(loads, start=start):
        t = i * PERIOD
        (d,) = policy.decide({"r0": snap(load, t, **kw)}, now=t)
        out.append(d)
    return out


def step_total(caps: Caps, load: int) -> int:
    """The step cap in tokens (None: everything the batch could verify)."""
    most = load * WINDOW
    return (
        0 if not caps.drafting else most if caps.max_step_tokens is None else min(most, caps.max_step_tokens)
    )


def settle_period(trace: list, final: Caps) -> int:
    """Periods (1-based) until the caps reached `final` and stayed there."""
    last_off = max((i for i, d in enumerate(trace) if d.caps != final), default=-1)
    return last_off + 2


def overshoots(values: list[int], final: int) -> int:
    """Times a trajectory went past its final value (to the far side of where it started)."""
    start = values[0]
    beyond = [(v - final) * (final - start) > 0 for v in values]
    return sum(1 for a, b in zip([False] + beyond, beyond) if b and not a)


def test_light_load_keeps_the_engine_defaults():
    trace = run(Policy(PolicyConfig(period_s=PERIOD)), [2] * 6)
    assert all(d.caps == DEFAULTS for d in trace)
    assert trace[-1].reason is Reason.STEADY


def test_load_step_up_shrinks_caps_and_step_down_restores_them_within_three_periods():
    """One window confirms, then at most two moves of half the range each: 3 periods up, 2 down."""
    policy = Policy(PolicyConfig(period_s=PERIOD))
    light, heavy = 2, 200
    run(policy, [light] * 4)
    up = run(policy, [heavy] * 8, start=4)
    shrunk = up[-1].caps
    assert shrunk.max_step_tokens == up[-1].inputs["cap_drafts"] == 489  # the model's cap at 200 requests
    assert shrunk.max_request_tokens is None  # the adaptive engine shares the step cap out itself
    assert [d.reason for d in up[:3]] == [Reason.UNCONFIRMED, Reason.SHRINK, Reason.SHRINK]
    assert [d.caps.max_step_tokens for d in up[:3]] == [None, heavy * WINDOW // 2, 489]
    assert [d.rate_limited for d in up[:3]] == [False, True, False]
    assert settle_period(up, shrunk) == 3
    down = run(policy, [light] * 8, start=12)
    assert down[-1].caps == DEFAULTS
    assert [d.reason for d in down[:2]] == [Reason.UNCONFIRMED, Reason.GROW]
    assert settle_period(down, DEFAULTS) == 2
    for trace, load in ((up, heavy), (down, light)):
        totals = [step_total(d.caps, load) for d in trace]
        assert overshoots(totals, totals[-1]) == 0
        assert sum(d.changed for d in trace) == settle_period(trace, trace[-1].caps) - 1  # one move a period


@pytest.mark.parametrize("heavy", [50, 120, 300, 440])
def test_every_load_step_settles_within_three_periods(heavy):
    """Whatever the size of the step, and back: confirmation plus at most two moves."""
    policy = Policy(PolicyConfig(period_s=PERIOD))
    run(policy, [2] * 3)
    up = run(policy, [heavy] * 8, start=3)
    down = run(policy, [2] * 8, start=11)
    assert up[-1].caps.max_step_tokens is not None and down[-1].caps == DEFAULTS
    for trace in (up, down):
        assert settle_period(trace, trace[-1].caps) <= 3
        assert all(not d.changed for d in trace[3:])


def test_a_ramp_is_followed_one_window_behind_and_settles_within_three_periods_of_its_end():
    """The right step cap in tokens may rise with load (each request brings drafts) while the budget per
    request falls; either way no move goes past the target it moves toward."""
    policy = Policy(PolicyConfig(period_s=PERIOD))
    ramp = [2, 2, 30, 60, 100, 150, 200] + [200] * 6
    trace = run(policy, ramp)
    final = trace[-1].caps
    end = ramp.index(200)  # the load stops moving here
    assert settle_period(trace[end:], final) <= 3
    assert sum(d.changed for d in trace[:end]) >= 1  # it moved during the ramp, not only after
    for d, load in zip(trace, ramp):
        if d.changed:
            before, after = step_total(d.previous, load), step_total(d.caps, load)
            target = min(load * WINDOW, d.inputs["cap_drafts"])
            assert min(before, target) <= after <= max(before, target)  # no overshoot


def test_an_engine_with_fixed_windows_is_capped_at_the_optimum_itself():
    adaptive, fixed = Policy(PolicyConfig(period_s=PERIOD)), Policy(PolicyConfig(period_s=PERIOD))
    a = run(adaptive, [200] * 6)[-1]
    f = run(fixed, [200] * 6, adaptive=False)[-1]
    assert f.caps.max_step_tokens == f.inputs["best_drafts"] < a.caps.max_step_tokens
    assert a.caps.max_step_tokens == a.inputs["cap_drafts"]


def test_a_single_noisy_window_is_not_acted_on():
    policy = Policy(PolicyConfig(period_s=PERIOD))
    trace = run(policy, [2, 2, 200, 2, 2, 2])
    assert all(d.caps == DEFAULTS for d in trace)
    assert trace[2].reason is Reason.UNCONFIRMED


def test_small_fluctuations_stay_in_the_dead_band():
    policy = Policy(PolicyConfig(period_s=PERIOD))
    run(policy, [200] * 6)
    settled = policy.caps("r0")
    trace = run(policy, [196, 204, 199, 203, 197, 201], start=6)
    assert all(d.caps == settled for d in trace)


def test_noise_makes_no_moves():
    """Seeded noise around a settled point. Load inside the dead band: nothing moves in 60 periods.
    Acceptance swinging from window to window (0.6 / 0.9 at 200 requests: targets 233 and 750 around
    the 489 in force, both outside the dead band) asks for opposite moves: nothing moves either."""
    rng = random.Random(7)
    policy = Policy(PolicyConfig(period_s=PERIOD))
    run(policy, [200] * 4)
    settled = policy.caps("r0")
    inside = run(policy, [rng.randint(185, 215) for _ in range(60)], start=4)
    assert {d.reason for d in inside} <= {Reason.STEADY, Reason.DEAD_BAND}
    assert Reason.DEAD_BAND in {d.reason for d in inside}  # the noise moved the target, not the caps
    outside = []
    for i in range(40):
        alpha = rng.choice((0.6, 0.62)) if i % 2 else rng.choice((0.88, 0.9))
        outside += run(policy, [200], start=64 + i, alpha=alpha)
    assert {d.reason for d in outside} == {Reason.UNCONFIRMED}
    assert all(d.caps == settled for d in inside + outside)


def test_moves_are_rate_limited_to_half_the_range():
    policy = Policy(PolicyConfig(period_s=PERIOD))
    trace = run(policy, [2, 2, 400, 400, 400, 400, 400])
    totals = [step_total(d.caps, 400) for d in trace[2:]]
    assert all(abs(b - a) <= 400 * WINDOW // 2 for a, b in zip(totals, totals[1:]))
    assert [d.rate_limited for d in trace[2:5]] == [False, True, False]


def converged(load: int, alpha: float = 0.8):
    """The decision in force once the policy has settled at `load` (one move: no rate limit)."""
    policy = Policy(PolicyConfig(period_s=PERIOD, limits=model_limits()))
    return run(policy, [load] * 3, alpha=alpha)[-1]


def model_limits():
    from controller.stability import Limits

    return Limits(max_move_frac=1.0)  # settle in one move


def engine_throughput(load: int, caps: Caps, alpha: float = 0.8) -> float:
    """What the engine reaches inside the caps: the best K under the step cap (the model's Θ)."""
    sps = model.SpsCurve.of(snap(1, 0).sps_table)
    surv = [alpha ** (j + 1) for j in range(WINDOW)]
    per_request = WINDOW if caps.max_request_tokens is None else caps.max_request_tokens
    top = min(step_total(caps, load), load * per_request)
    return max(model.throughput(load, k, surv[:per_request], sps) for k in range(top + 1))


def threshold_caps(load: int) -> Caps:
    """vLLM-style speculation by batch-size table: full window up to 32 requests, none above."""
    return DEFAULTS if load <= 32 else Caps(drafting=False)


@pytest.mark.parametrize("alpha", [0.6, 0.8, 0.9])
def test_no_cliff_predicted_throughput_is_continuous_in_load(alpha):
    """Every load from 1 to 300: the caps the policy settles on let the engine reach a throughput that
    never falls as load rises and rises by at most one request's share; the budget per request never
    rises, and the step cap grows by at most one request's budget (plus a token of rounding)."""
    loads = list(range(1, 301))
    settled = [converged(n, alpha) for n in loads]
    ours = [engine_throughput(n, d.caps, alpha) for n, d in zip(loads, settled)]
    table = [engine_throughput(n, threshold_caps(n), alpha) for n in loads[::3]]
    for n, (a, b), (da, db) in zip(loads, zip(ours, ours[1:]), zip(settled, settled[1:])):
        assert a <= b * (1 + 1e-12) and b <= a * (1 + 1 / n) * (1 + 1e-12)
        assert db.inputs["cap_depth"] <= da.inputs["cap_depth"]
        assert step_total(db.caps, n + 1) <= step_total(da.caps, n) + da.inputs["cap_depth"] + 1
    assert (
        max(1 - b / a for a, b in zip(table, table[1:])) > 0.2
    )  # the check does see a cliff where one exists
    # The caps never cost more than the slack against the best any cap could do.
    for n, t in zip(loads, ours):
        assert t >= (1 - 0.02) * engine_throughput(n, DEFAULTS, alpha) - 1e-9


def test_stale_telemetry_falls_back_to_the_engine_defaults():
    policy = Policy(PolicyConfig(period_s=PERIOD))
    run(policy, [200] * 6)
    assert policy.caps("r0") != DEFAULTS
    t = 6 * PERIOD
    (fresh,) = policy.decide({"r0": snap(200, t, taken_at=t - 3 * PERIOD)}, now=t)
    assert fresh.reason is not Reason.STALE and fresh.caps != DEFAULTS
    (stale,) = policy.decide({"r0": snap(200, t + 0.1, taken_at=t - 3 * PERIOD)}, now=t + 0.1)
    assert stale.reason is Reason.STALE and stale.caps == DEFAULTS and stale.changed
    assert policy.caps("r0") == DEFAULTS


def test_acceptance_collapse_switches_drafting_off_then_probes():
    cfg = PolicyConfig(period_s=PERIOD, probe_after=3)
    policy = Policy(cfg)
    run(policy, [8] * 3)
    collapse = run(policy, [8] * 2, start=3, alpha=0.05)
    assert [d.reason for d in collapse] == [Reason.STEADY, Reason.COLLAPSE]
    assert collapse[1].caps.budget()["max_step_tokens"] == 0
    held = run(policy, [8] * 2, start=5, alpha=0.05, verified=0)  # drafting off: nothing verified
    assert [d.reason for d in held] == [Reason.DRAFTING_OFF] * 2
    (probe,) = run(policy, [8], start=7, verified=0)
    assert probe.reason is Reason.PROBE and probe.caps.drafting
    (again,) = run(policy, [8], start=8, alpha=0.05)  # one window suffices while probing
    assert again.reason is Reason.COLLAPSE and not again.caps.drafting
    waited = run(policy, [8] * 6, start=9, verified=0)  # the wait doubled: 6 periods
    assert [d.reason for d in waited] == [Reason.DRAFTING_OFF] * 5 + [Reason.PROBE]
    recovered = run(policy, [8] * 3, start=15, alpha=0.8)
    assert all(d.caps.drafting for d in recovered)


def test_without_evidence_the_caps_in_force_are_kept():
    policy = Policy(PolicyConfig(period_s=PERIOD))
    trace = run(policy, [200] * 3, verified=5)
    assert {d.reason for d in trace} == {Reason.NO_EVIDENCE}
    assert all(d.caps == DEFAULTS for d in trace)


def test_interactive_class_gets_priority_over_batch_then_releases():
    cfg = PolicyConfig(period_s=PERIOD, sla_classes={"chat": SlaTarget(0.012, interactive=True)})
    policy = Policy(cfg)

    def classes(tpot):
        return {"chat": ClassStats(running=20, tpot_s=tpot), "batch": ClassStats(running=100)}

    slow = run(policy, [120] * 4, classes=classes(0.02))
    caps = slow[-1].caps
    assert caps.interactive_priority and caps.by_class["chat"] == WINDOW
    assert caps.by_class["batch"] < WINDOW
    assert Reason.SLA_PRIORITY in {d.reason for d in slow}
    fast = run(policy, [120] * 4, start=4, classes=classes(0.005))
    assert not fast[-1].caps.interactive_priority and fast[-1].caps.by_class == {}
    assert Reason.SLA_RELEASE in {d.reason for d in fast}


def test_priority_never_cuts_a_class_below_what_its_own_tpot_target_needs():
    """Interactive chat misses its TPOT by so much that even no drafts for the other class would not
    fix it (the model predicts 5.4 ms x the measured/predicted ratio 2.7 = 14.6 ms > 12 ms): a class
    with no target of its own is cut to 0; a class with one keeps the fewest drafts that meet it (at
    120 requests on the synthetic table: 0 drafts 22.4 ms, 1 draft 14.6 ms against its 20 ms)."""

    def caps_with(targets: dict[str, SlaTarget]) -> Caps:
        policy = Policy(PolicyConfig(period_s=PERIOD, sla_classes=targets))
        classes = {"chat": ClassStats(running=20, tpot_s=0.02), "standard": ClassStats(running=100)}
        return run(policy, [120] * 4, classes=classes)[-1].caps

    chat = {"chat": SlaTarget(0.012, interactive=True)}
    assert caps_with(chat).by_class == {"chat": WINDOW, "standard": 0}
    assert caps_with(chat | {"standard": SlaTarget(0.02)}).by_class == {"chat": WINDOW, "standard": 1}
    # A loose target of its own costs nothing: the class is cut as far as the priority asks.
    assert caps_with(chat | {"standard": SlaTarget(0.03)}).by_class == {"chat": WINDOW, "standard": 0}


def test_pins_and_pause():
    policy = Policy(PolicyConfig(period_s=PERIOD))
    policy.pins["r0"] = Caps(max_step_tokens=5)
    (d,) = run(policy, [2])
    assert d.reason is Reason.PINNED and d.caps == Caps(max_step_tokens=5)
    policy.pins.clear()
    policy.paused = True
    (d,) = run(policy, [2], start=1)
    assert d.reason is Reason.PAUSED and not d.changed and d.caps == Caps(max_step_tokens=5)


def test_decisions_carry_their_evidence_as_event_attributes():
    policy = Policy(PolicyConfig(period_s=PERIOD))
    d = run(policy, [200] * 3)[-1]
    attrs = d.event_attributes()
    assert attrs["dspark.controller.reason"] == d.reason.value
    assert attrs["dspark.controller.input.load"] == 200
    assert attrs["dspark.controller.input.acceptance_1"] == 0.8
    assert all(isinstance(v, (bool, int, float, str)) for v in attrs.values())


def test_replicas_that_leave_are_forgotten():
    policy = Policy(PolicyConfig(period_s=PERIOD))
    decisions = policy.decide({"a": snap(200, 0, replica_id="a"), "b": snap(2, 0, replica_id="b")}, now=0)
    assert [d.replica_id for d in decisions] == ["a", "b"]
    assert [d.replica_id for d in policy.decide({"b": snap(2, 2, replica_id="b")}, now=2)] == ["b"]


def test_period_outside_one_to_ten_seconds_is_refused():
    with pytest.raises(ValueError, match="period_s"):
        PolicyConfig(period_s=0.5)


def test_snapshots_read_from_replica_stats():
    from controller.telemetry import from_routing_stats

    base = {
        "replica_id": "x",
        "running_requests": 3,
        "queued_requests": 1,
        "max_num_seqs": 8,
        "draft_window": 4,
    }
    tapped = from_routing_stats(
        {
            **base,
            "acceptance_by_position": [0.9, 0.8],
            "window_rounds": 10,
            "window_verified": 30,
            "running_by_class": {"chat": 2, "": 1},
            "tpot_by_class": {"chat": 0.05},
            "draft_budget": {"max_step_tokens": 6},
        },
        taken_at=5.0,
    )
    assert tapped.acceptance == (0.9, 0.8) and tapped.verified_drafts == 30 and tapped.load == 4
    assert tapped.verify_tokens_per_step == 3 * 3.0
    assert tapped.classes["chat"] == ClassStats(running=2, tpot_s=0.05)
    assert tapped.classes["default"] == ClassStats(running=1)
    # Routing stats alone: the geometric acceptance that explains their tau.
    routed = from_routing_stats(
        {**base, "recent_tau": 2.0, "mean_verified": 2.0}, taken_at=5.0, rounds_in_window=50
    )
    assert routed.acceptance == pytest.approx((0.618,) * 4, abs=1e-3) and routed.verified_drafts == 100
    assert from_routing_stats(base, taken_at=0.0).acceptance == ()


def test_step_time_limit_follows_the_tightest_tpot_target_running_there():
    """max_step_s = the tightest running class's TPOT x (1 + alpha_1), confirmed over two windows like
    every move; a class that stops running no longer counts; no class with a target: no limit."""
    targets = {"chat": SlaTarget(0.012, interactive=True), "standard": SlaTarget(0.02)}
    policy = Policy(PolicyConfig(period_s=PERIOD, sla_classes=targets))
    both = {"chat": ClassStats(running=2), "standard": ClassStats(running=2)}
    trace = run(policy, [4] * 3, classes=both)
    assert [d.reason for d in trace] == [Reason.UNCONFIRMED, Reason.STEP_TIME, Reason.STEADY]
    assert trace[-1].caps == Caps(max_step_s=0.0216)  # 12 ms x 1.8; the draft caps stay the defaults
    assert trace[-1].caps.budget()["max_step_s"] == 0.0216 and trace[-1].inputs["max_step_s"] == 0.0216
    # Acceptance 0.81 asks for 21.7 ms: inside the dead band, nothing moves.
    assert run(policy, [4] * 2, start=3, classes=both, alpha=0.81)[-1].reason is Reason.DEAD_BAND
    standard_only = {"chat": ClassStats(running=0), "standard": ClassStats(running=4)}
    assert run(policy, [4] * 2, start=5, classes=standard_only)[-1].caps.max_step_s == 0.036
    untargeted = {"batch": ClassStats(running=4)}
    assert run(policy, [4] * 2, start=7, classes=untargeted)[-1].caps == DEFAULTS

    off = Policy(PolicyConfig(period_s=PERIOD, sla_classes=targets, step_time_limit=False))
    assert all(d.caps == DEFAULTS for d in run(off, [4] * 3, classes=both))
