"""bench/route_sim.py: bench/route.py's settings built for the simulator, its requests and outcomes
translated both ways, the summary over seeds, and a short run end to end."""

from __future__ import annotations

import argparse
import json
from collections import Counter

import pytest

from bench.route_sim import (
    DOMAINS,
    MAX_ONGOING,
    classes_of,
    fleet,
    greedy_profile,
    main,
    outcome_of,
    parse_option,
    requests_of,
    summarise,
)
from bench.route_workload import Arrival, SlaTarget
from router.speed import tau
from sim.profiles import load
from sim.workload import Request

TARGETS = [SlaTarget("interactive", 0.5, 1.5, 0.04), SlaTarget("batch", 0.5, 20.0, 1.0)]


def test_the_acceptance_row_gives_the_tau_asked_for_and_the_spread_either_side():
    (row,) = set(greedy_profile(load("cpu_measured"), 1.55, 7).acceptance[DOMAINS[0]])
    assert tau(row, 7) == pytest.approx(1.55, abs=1e-9)
    profile = greedy_profile(load("cpu_measured"), 1.55, 5, spread=0.25)
    assert profile.gamma == 5
    hard, easy = (profile.acceptance[d] for d in DOMAINS)
    assert len(hard) == len(easy) == 5 and len(set(hard)) == len(set(easy)) == 1  # one alpha a row
    assert tau(hard[0], 5) == pytest.approx(1.30) and tau(easy[0], 5) == pytest.approx(1.80)


def test_the_fleet_is_one_replica_per_slot_count_drafting_a_fixed_block_on_one_host():
    groups = fleet(load("cpu_measured"), (8, 2))
    assert [(g.profile.max_num_seqs, g.count, g.scheduler, g.drafting) for g in groups] == [
        (8, 1, "fixed", True),
        (2, 1, "fixed", True),
    ]
    assert groups[0].profile.host == groups[1].profile.host  # the host block: they share the 2 cores
    assert MAX_ONGOING == 8


def test_classes_are_the_benchmarks_interactive_may_be_refused_and_comes_first():
    classes = classes_of(TARGETS)
    assert classes["interactive"].priority == 0 and classes["interactive"].may_shed
    assert classes["batch"].priority == 1 and not classes["batch"].may_shed
    assert (classes["interactive"].ttft_s, classes["interactive"].tpot_s) == (1.5, 0.04)


def test_requests_keep_their_arrival_and_lengths_and_draw_a_domain_by_a_fixed_coin():
    arrivals = [Arrival(0.000001 * k, "batch", 10 + k, 5 + k) for k in range(1, 5)]
    requests = requests_of(arrivals)
    assert [(r.rid, r.prompt_tokens, r.max_tokens, r.sla_class) for r in requests] == [
        (0, 11, 6, "batch"),
        (1, 12, 7, "batch"),
        (2, 13, 8, "batch"),
        (3, 14, 9, "batch"),
    ]
    assert [r.domain for r in requests] == ["easy", "hard", "easy", "hard"]  # the microsecond's parity
    assert [r.domain for r in requests_of(arrivals[::-1])] == ["hard", "easy", "hard", "easy"]


def test_a_simulated_request_is_recorded_as_the_real_client_records_it():
    arrival = Arrival(1.0, "interactive", 10, 5)

    def request(**fields) -> Request:
        req = Request(0, 1.0, 10, 5, "interactive", "easy")
        for name, value in fields.items():
            setattr(req, name, value)
        return req

    done = outcome_of(request(outcome="done", first_token=1.2, finish=1.6, generated=5), arrival)
    assert (done.status, done.tokens) == ("ok", 5)
    assert done.ttft_s == pytest.approx(0.2) and done.tpot_s == pytest.approx(0.1)
    one = outcome_of(request(outcome="done", first_token=1.2, finish=1.2, generated=1), arrival)
    assert one.tpot_s is None  # one token has no TPOT, as the client records it
    assert outcome_of(request(outcome="shed"), arrival).status == "refused"
    assert outcome_of(request(outcome="refused"), arrival).status == "refused"
    assert outcome_of(request(outcome="failed", generated=2), arrival).status == "error"


def point(rate: float, attainment: float, met_rps: float) -> dict:
    return {"rate_rps": rate, "load": rate, "attainment": attainment, "met_rps": met_rps}


def test_the_summary_pairs_the_sla_arm_with_pow2_seed_by_seed_and_over_all_seeds():
    by_seed = {
        "pow2": [[point(1, 0.95, 1.0), point(2, 0.8, 1.6)], [point(1, 0.85, 0.9), point(2, 0.5, 1.0)]],
        "sla": [[point(1, 0.99, 1.0), point(2, 0.92, 1.8)], [point(1, 0.95, 1.0), point(2, 0.7, 1.4)]],
    }
    out = summarise(by_seed)
    assert out["arms"]["pow2"]["goodput_rps_by_seed"] == [1.0, 0.0]
    assert out["arms"]["sla"]["goodput_rps_by_seed"] == [1.8, 1.0]
    assert out["ratio_vs_pow2_by_seed"] == [1.8, None]  # pow2 met no load point at 90 % in seed 1
    assert out["ratio_vs_pow2"] == pytest.approx(2.8)  # summed over seeds: 2.8 / 1.0
    assert out["arms"]["sla"]["points"][1]["attainment"] == pytest.approx(0.81)


def test_policy_options_are_named_fields_with_numbers_or_booleans():
    assert parse_option("tie_margin=0.1") == ("tie_margin", 0.1)
    assert parse_option("calibrate_tpot=true") == ("calibrate_tpot", True)
    for wrong in ("tie_margn=0.1", "tie_margin=", "tie_margin"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_option(wrong)


def test_a_quick_run_scores_every_arm_at_every_load_in_both_settings(tmp_path):
    out = tmp_path / "route_sim.json"
    assert main(["--quick", "--settings", "uniform", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    uniform = result["settings"]["uniform"]
    assert uniform["capacity_rps"] > 0 and uniform["interactive_tpot_ms"] == 53.5
    assert set(uniform["arms"]) == {"pow2", "round_robin", "sla"}
    for arm in uniform["arms"].values():
        assert [p["load"] for p in arm["points"]] == [0.6, 1.3]
        assert all(p["sent"] > 0 for p in arm["points"])
    # Every arm replays the same schedules: the same requests sent at every load.
    sent = Counter(tuple(p["sent"] for p in arm["points"]) for arm in uniform["arms"].values())
    assert len(sent) == 1
