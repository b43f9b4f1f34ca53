"""The controller arm: acceptance by position from counted rounds, and controller/'s own policy setting
the simulated replicas' budgets (when controller/ is installed)."""

from __future__ import annotations

from collections import Counter

import pytest

from sim.control import acceptance_by_position


def test_acceptance_by_position_is_conditional_on_the_slots_before():
    # (verified, accepted) -> rounds: slot 1 reached by all 10 rounds and accepted by 8; slot 2 reached
    # (verified and slot 1 accepted) by 6 rounds, accepted by 3; slot 3 never verified.
    rounds = Counter({(2, 0): 2, (1, 1): 2, (2, 1): 3, (2, 2): 3})
    assert acceptance_by_position(rounds, 7) == pytest.approx((0.8, 0.5))
    assert acceptance_by_position(Counter(), 7) == ()


def test_the_controller_arm_applies_controller_policy_caps(monkeypatch):
    policy = pytest.importorskip("controller.policy", reason="controller/ has not landed on this branch")
    from sim.control import ControllerArm
    from tests.sim.test_simulator import CLASSES, simulate

    calls = Counter()
    decide = policy.Policy.decide

    def counting(self, snapshots, now):
        calls["decide"] += 1
        calls["replicas"] += len(snapshots)
        return decide(self, snapshots, now)

    monkeypatch.setattr(policy.Policy, "decide", counting)
    arm = ControllerArm(CLASSES)
    cluster, requests = simulate("sla", rate=40.0, controller=arm, control_period_s=1.0)
    assert calls["decide"] >= 10 and calls["replicas"] == 3 * calls["decide"]
    assert sum(arm.reasons.values()) == calls["replicas"]  # one decision per replica per period
    assert all(r.outcome in ("done", "shed", "refused") for r in requests)


def test_the_controller_arm_sets_the_step_time_limit_the_replicas_plan_with(monkeypatch):
    """controller/'s own _step_time sets each replica's max_step_s (the tightest running class's TPOT,
    interactive 30 ms or standard 60 ms, x (1 + alpha_1)); the replica plans its prefill with
    dspark.step_budget under it."""
    policy = pytest.importorskip("controller.policy", reason="controller/ has not landed on this branch")
    import sim.replica
    from sim.control import ControllerArm
    from tests.sim.test_simulator import CLASSES, simulate

    limits, seen = [], Counter()
    step_time = policy.Policy._step_time
    prefill = sim.replica.prefill_tokens

    def recording(self, snap, acceptance):
        limit = step_time(self, snap, acceptance)
        limits.append((limit, acceptance[0]))
        return limit

    def planned(sps, decode, max_step_s, most, floor):
        seen[max_step_s is not None] += 1
        return prefill(sps, decode, max_step_s, most, floor)

    monkeypatch.setattr(policy.Policy, "_step_time", recording)
    monkeypatch.setattr(sim.replica, "prefill_tokens", planned)
    cluster, _ = simulate("sla", rate=40.0, controller=ControllerArm(CLASSES), control_period_s=1.0)
    options = [{None, round(0.03 * (1 + a1), 4), round(0.06 * (1 + a1), 4)} for _, a1 in limits]
    assert limits and all(limit in allowed for (limit, _), allowed in zip(limits, options))
    assert any(limit == round(0.03 * (1 + a1), 4) for limit, a1 in limits)
    assert {r.budget.max_step_s for r in cluster.replicas} <= {limit for limit, _ in limits}
    assert seen[True] > 0 and seen[False] > 0  # before the first decisions: no limit
