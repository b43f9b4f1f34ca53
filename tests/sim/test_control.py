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
