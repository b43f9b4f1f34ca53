"""Scenario settings: the engines' step token budget can differ from the profile's at the same traffic."""

from __future__ import annotations

import sim.replica
from sim.scenario import Scenario, run


def test_a_step_token_budget_override_serves_every_replica_at_it_with_the_same_traffic(monkeypatch):
    common = dict(profile="gpu_dsv4flash_rocm", replicas=3, router="pow2", duration_s=4.0, warmup_s=1.0)
    default_config, default_work, default_capacity = Scenario(**common).build()
    config, work, capacity = Scenario(**common, max_num_batched_tokens=512).build()
    assert [g.profile.max_num_batched_tokens for g in default_config.fleet] == [2048]
    assert [g.profile.max_num_batched_tokens for g in config.fleet] == [512]
    assert (work.rate, capacity) == (default_work.rate, default_capacity)

    largest = []
    plan = sim.replica.SimReplica.plan

    def recorded(replica):
        step = plan(replica)
        if step is not None:
            largest.append(step.tokens)
        return step

    monkeypatch.setattr(sim.replica.SimReplica, "plan", recorded)
    result = run(Scenario(**common, max_num_batched_tokens=512, drain_s=20.0))
    assert result["summary"]["finished"] == result["summary"]["requests"] > 0
    assert max(largest) == 512  # long prompts fill whole steps, never more
