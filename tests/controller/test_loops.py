"""The two loops together: the engine's real Algorithm 1 (dspark.scheduler.schedule) every step inside the
controller's caps every period. They must not fight: the caps settle and stay put while the engine keeps
adapting inside them, and the engine under the caps loses at most the controller's slack against the
engine alone. The engine here is the scheduler on seeded per-request confidences and the engine's own
cost table, no model."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from synthetic_telemetry import WINDOW, snap

from controller.decision import Caps
from controller.policy import Policy, PolicyConfig
from dspark.cost_table import CostTable
from dspark.scheduler import schedule, survival

PERIOD = 2.0
STEPS_PER_PERIOD = 40


def expected_rate(survivals: list[list[float]], lengths: list[int], sps) -> float:
    """Expected tokens per second of one step verifying `lengths` (the survivals are the true ones)."""
    gain = sum(sum(s[:n]) for s, n in zip(survivals, lengths))
    return (len(survivals) + gain) * sps(len(survivals) + sum(lengths))


def engine_steps(load: int, caps: Caps, rng: random.Random, alpha: float) -> tuple[float, float, int, int]:
    """STEPS_PER_PERIOD engine steps under `caps`: (tokens/s, tokens/s the engine alone would reach,
    drafts verified, steps where the step cap cut the engine's own choice)."""
    # The engine reads its own table (linear in rate, as dspark/cost_table.py does), the controller plans
    # with its smoothed step time (controller/model.py): the two need not agree for the loops to get on.
    table = snap(1, 0).sps_table
    sps = CostTable([b for b, _ in table], [r for _, r in table], max_tokens=table[-1][0])
    budget = caps.budget()
    per_request = WINDOW if budget["max_request_tokens"] is None else budget["max_request_tokens"]
    step_cap = load * WINDOW if budget["max_step_tokens"] is None else budget["max_step_tokens"]
    capped_rate = alone_rate = 0.0
    verified = binding = 0
    for _ in range(STEPS_PER_PERIOD):
        # Calibrated confidences: each request's acceptance varies around alpha.
        survivals = []
        for _ in range(load):
            a = min(0.99, max(0.01, rng.gauss(alpha, 0.15)))
            survivals.append(survival([a] * WINDOW))

        alone = schedule(survivals, sps, load * WINDOW)
        capped = schedule([s[:per_request] for s in survivals], sps, step_cap)
        binding += sum(capped) < sum(alone) and sum(capped) == step_cap
        capped_rate += expected_rate(survivals, capped, sps) / STEPS_PER_PERIOD
        alone_rate += expected_rate(survivals, alone, sps) / STEPS_PER_PERIOD
        verified += sum(capped)
    return capped_rate, alone_rate, verified, binding


@pytest.mark.parametrize("load", [4, 64, 160])
def test_engine_and_controller_do_not_fight(load):
    rng = random.Random(load)
    policy = Policy(PolicyConfig(period_s=PERIOD))
    caps_seen, ratios, binding = [], [], 0
    for period in range(10):
        capped, alone, verified, bound = engine_steps(load, policy.caps("r0"), rng, 0.75)
        if period >= 3:
            ratios.append(capped / alone)
            binding += bound
        t = period * PERIOD
        # The controller sees what the engine did inside its caps: drafts verified per step, acceptance.
        telemetry = replace(
            snap(load, t, alpha=0.75, verified=verified), verify_tokens_per_step=verified / STEPS_PER_PERIOD
        )
        (decision,) = policy.decide({"r0": telemetry}, now=t)
        caps_seen.append(decision.caps)
    assert len(set(caps_seen[3:])) == 1  # settled by period 3, then never moved again
    assert min(ratios) >= 0.97  # the engine inside the caps keeps (almost) all it reaches alone
    assert binding <= 0.25 * 7 * STEPS_PER_PERIOD  # the caps rarely override the engine's own choice
