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


def test_a_run_reports_the_drafts_its_replicas_verified_and_accepted_per_request_round():
    """The work speculation did beside an arm's goodput: read from the replicas' own round counts."""
    common = dict(profile="gpu_dsv4flash_rocm", replicas=2, router="pow2", duration_s=3.0, drain_s=10.0)
    result = run(Scenario(**common, scheduler="fixed"))
    reps = result["cluster"].all_replicas()
    rounds = sum(r.counters.rounds for r in reps)
    verified = accepted = 0
    for r in reps:
        for (n, a), count in r.counters.verify_accept.items():
            verified, accepted = verified + n * count, accepted + a * count
    assert result["verify_per_round"] == round(verified / rounds, 4)
    assert result["accepted_per_round"] == round(accepted / rounds, 4)
    assert result["accepted_share"] == round(accepted / verified, 4)
    assert 0 < result["accepted_per_round"] < result["verify_per_round"] <= 7  # gamma: a block of 7
    plain = run(Scenario(**common, scheduler="plain"))
    assert (plain["verify_per_round"], plain["accepted_per_round"], plain["accepted_share"]) == (0, 0, 0)
