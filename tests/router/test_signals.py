"""Fresh signals: pushed stats parsed into a replica's speed, corrected by the router's own ledger,
and aged; the Balancer that keeps them between decisions."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace

import pytest

from router import decisions
from router.balancer import PREFIX_MEMORY_S, Balancer
from router.policy import Newcomer, PolicyConfig, PromptPages, Sla, predict
from router.signals import (
    CALIBRATION_MAX_AGE_S,
    MAX_CALIBRATION,
    MAX_SPS_SCALE,
    MIN_CALIBRATION,
    PREFILL_RATE_HALF_LIFE_S,
    Ledger,
    decode_calibration,
    fit_acceptance,
    replica_state,
    smooth_speed,
    speed_of,
    sps_scale,
)
from router.speed import SpsTable, step_time, tau

STANDARD = Sla("standard", ttft_s=5.0, tpot_s=0.25, priority=1)
INTERACTIVE = Sla("interactive", ttft_s=1.0, tpot_s=0.05, priority=0, may_shed=True)
CLASSES = {"standard": STANDARD, "interactive": INTERACTIVE}


def stats(ts: float, **fields) -> dict:
    """A replica's routing stats as TargetReplica.record_routing_stats publishes them."""
    return {
        "ts": ts,
        "running_requests": 2,
        "queued_requests": 1,
        "queued_prefill_tokens": 40,
        "kv_unreserved_pages": 50,
        "kv_total_pages": 64,
        "kv_page_size": 16,
        "max_num_seqs": 8,
        "max_num_batched_tokens": 256,
        "remaining_tokens": [30, 10],
        "running_by_class": {"interactive": 2, "": 1},
        "draft_window": 7,
        "adaptive_verify": True,
        "draft_budget": {
            "max_step_tokens": 20,
            "max_request_tokens": 5,
            "max_request_tokens_by_class": {"b": 9},
        },
        "sps_table": [[1, 100.0], [256, 20.0]],
        "recent_tau": 3.0,
        "mean_verified": 4.0,
        "step_overhead": 1.25,
        "healthy": True,
        **fields,
    }


def test_acceptance_is_fitted_so_the_geometric_law_gives_the_measured_tau():
    alpha = fit_acceptance(recent_tau=3.0, mean_verified=4.0, prior=0.5)
    assert tau(alpha, 4.0) == pytest.approx(3.0, abs=1e-9)
    assert fit_acceptance(5.0, 4.0, prior=0.5) == 0.999  # everything accepted
    assert fit_acceptance(1.0, 4.0, prior=0.5) == pytest.approx(0.0, abs=1e-9)  # nothing accepted
    assert fit_acceptance(0.0, 0.0, prior=0.3) == 0.3  # nothing verified yet: the prior


def test_speed_and_state_from_stats():
    speed = speed_of(stats(10.0), prior_acceptance=0.5)
    assert speed.sps(1) == 100.0 and speed.sps(256) == 20.0 and speed.max_batch_tokens == 256
    assert speed.draft_cap == 5 and speed.class_caps == {"b": 7}  # the budget, cut to the window
    assert speed.step_draft_cap == 20 and speed.adaptive and speed.overhead == 1.25
    assert tau(speed.acceptance, 4.0) == pytest.approx(3.0)
    assert speed_of(stats(10.0, sps_table=None), 0.5) is None  # no table: no prediction
    state = replica_state("r", stats(10.0), speed, CLASSES, STANDARD, age_s=0.5)
    assert (state.running, state.queued, state.queued_prefill_tokens) == (2, 1, 40)
    assert (state.free_pages, state.total_pages, state.max_num_seqs) == (50, 64, 8)
    assert state.remaining_tokens == (10, 30) and state.age_s == 0.5
    # Class names map to their targets; a request with none runs under the default class.
    assert set(state.running_slas) == {INTERACTIVE, STANDARD}


def test_the_table_is_scaled_to_the_forward_rate_the_replica_measured():
    # The table gives SPS(128) = 100 - 80 * 127 / 255; the replica measured half that at 128 tokens.
    slow = stats(10.0, recent_forward_tokens=128.0, recent_forward_sps=(100 - 80 * 127 / 255) / 2)
    assert sps_scale(speed_of(stats(10.0), 0.5).sps, slow) == pytest.approx(0.5)
    speed = speed_of(slow, 0.5)
    assert speed.sps(1) == pytest.approx(50.0) and speed.sps(256) == pytest.approx(10.0)
    # Nothing measured yet: the table as profiled. A wild reading is clamped.
    assert speed_of(stats(10.0), 0.5).sps(1) == 100.0
    wild = stats(10.0, recent_forward_tokens=128.0, recent_forward_sps=6000.0)
    assert speed_of(wild, 0.5).sps(1) == pytest.approx(100.0 * MAX_SPS_SCALE)


def test_decode_steps_are_calibrated_to_the_wall_time_the_replica_measured():
    base = speed_of(stats(10.0), 0.5)
    # The replica's decoding requests waited 1.5x the model's step at their 24 decode tokens per round.
    measured = 1.5 * step_time(base, 24.0)
    slow = stats(10.0, recent_round_s=measured, recent_round_tokens=24.0, recent_round_ts=9.0)
    assert decode_calibration(base.sps, base.overhead, slow) == pytest.approx(1.5)
    speed = speed_of(slow, 0.5)
    assert speed.calibration == pytest.approx(1.5) and speed.sps(1) == base.sps(1)
    # So it is predicted 1.5x slower: the newcomer's TPOT and its residents'.
    newcomer = Newcomer(prompt_tokens=30, max_tokens=40, sla=STANDARD)
    as_measured = predict(replica_state("r", slow, speed, CLASSES, STANDARD, 0.0), newcomer)
    as_modelled = predict(replica_state("r", stats(10.0), base, CLASSES, STANDARD, 0.0), newcomer)
    assert as_measured.tpot_s == pytest.approx(1.5 * as_modelled.tpot_s)
    assert as_measured.tpot_others_s == pytest.approx(1.5 * as_modelled.tpot_others_s)
    # Measured against the model as it stands (the forward-rate scale and the overhead included): the
    # calibrated step is the measured one whatever those say.
    scaled = {
        **slow,
        "recent_forward_tokens": 24.0,
        "recent_forward_sps": 2 * base.sps(24.0),
        "step_overhead": 2.0,
    }
    assert step_time(speed_of(scaled, 0.5), 24.0) * speed_of(scaled, 0.5).calibration == pytest.approx(
        measured
    )


def test_an_absent_old_or_wild_decode_measurement_falls_back_or_is_clamped():
    base = speed_of(stats(10.0), 0.5)
    assert speed_of(stats(10.0), 0.5).calibration == 1.0  # nothing measured yet: the model alone
    at = 1.5 * step_time(base, 24.0)
    old = stats(
        100.0, recent_round_s=at, recent_round_tokens=24.0, recent_round_ts=100.0 - CALIBRATION_MAX_AGE_S - 1
    )
    assert speed_of(old, 0.5).calibration == 1.0  # idle for a minute: no longer trusted
    recent = {**old, "recent_round_ts": 100.0 - CALIBRATION_MAX_AGE_S + 1}
    assert speed_of(recent, 0.5).calibration == pytest.approx(1.5)
    wild = {**recent, "recent_round_s": 100 * at}
    assert speed_of(wild, 0.5).calibration == MAX_CALIBRATION
    assert speed_of({**recent, "recent_round_s": at / 100}, 0.5).calibration == MIN_CALIBRATION
    assert speed_of({**recent, "recent_round_tokens": 0.0}, 0.5).calibration == 1.0


def test_ledger_adds_what_the_snapshot_does_not_hold_and_removes_what_finished_but_it_still_holds():
    ledger = Ledger()
    base = replica_state("r", stats(10.0), speed_of(stats(10.0), 0.5), CLASSES, STANDARD, 0.0)
    early = Newcomer(prompt_tokens=30, max_tokens=34, sla=STANDARD, key="e1")  # 64 tokens: 4 pages
    ledger.sent("r", "early", early, page_size=16, now=9.0)
    ledger.routed("r", "early", early, page_size=16, now=9.0)
    late = Newcomer(prompt_tokens=20, max_tokens=12, sla=INTERACTIVE, key="l1")  # 32 tokens: 2 pages
    ledger.sent("r", "late", late, page_size=16, now=10.5)
    # The snapshot holds "early" (its engine runs it) and not yet "late": only "late" is added.
    state = ledger.apply(base, held={"e1", "x"}, snapshot_at=10.0, now=10.6)
    assert (state.running, state.queued, state.queued_prefill_tokens) == (2, 2, 60)
    assert state.free_pages == 48 and state.remaining_tokens == (10, 12, 30)
    # "early" finishes; the snapshot still holds it: the ledger takes it out.
    ledger.completed("r", "early", now=10.7)
    state = ledger.apply(base, held={"e1", "x"}, snapshot_at=10.0, now=10.8)
    assert (state.running, state.queued, state.free_pages) == (1, 2, 52)
    # Even a snapshot taken after it finished (the replica had not yet freed it) is corrected.
    assert ledger.apply(base, held={"e1", "x"}, snapshot_at=10.9, now=11.0).running == 1
    # A newer snapshot holds "late" and no longer "early": nothing is corrected twice.
    newer = replica_state("r", stats(11.0), base.speed, CLASSES, STANDARD, 0.0)
    assert ledger.apply(newer, held={"l1", "x"}, snapshot_at=11.0, now=11.1) == newer


def test_ledger_moves_a_request_placed_elsewhere_and_expires_unconfirmed_ones():
    ledger = Ledger(tentative_ttl_s=2.0)
    request = Newcomer(prompt_tokens=10, max_tokens=6, sla=STANDARD, key="k")
    ledger.sent("a", "k", request, page_size=16, now=0.0)
    assert ledger.in_flight("a") == 1
    ledger.routed("b", "k", request, page_size=16, now=0.1)  # "a" was full: Serve took the next rank
    assert (ledger.in_flight("a"), ledger.in_flight("b")) == (0, 1)
    ledger.sent("a", "gone", replace(request, key="g"), page_size=16, now=0.0)  # cancelled while waiting
    base = replica_state("a", stats(-1.0), speed_of(stats(-1.0), 0.5), CLASSES, STANDARD, 0.0)
    assert ledger.apply(base, held=(), snapshot_at=-1.0, now=1.0).queued == base.queued + 1
    assert ledger.apply(base, held=(), snapshot_at=-1.0, now=2.5).queued == base.queued
    ledger.forget("b")
    assert ledger.in_flight("b") == 0


def balancer() -> Balancer:
    return Balancer(PolicyConfig(stale_after_s=1.0), CLASSES, "standard", seed=0)


def test_a_burst_decided_before_any_confirmation_spreads():
    lb = balancer()
    idle = {name: stats(100.0, running_requests=0, queued_requests=0, remaining_tokens=[]) for name in "ab"}
    chosen = [lb.decide(Newcomer(10, 10, STANDARD), f"k{i}", idle, now=100.1).ranking[0] for i in range(6)]
    assert sorted(chosen) == ["a", "a", "a", "b", "b", "b"]


def test_the_router_calibrates_its_tpot_only_when_configured_to():
    base = speed_of(stats(100.0), 0.5)
    measured = stats(
        100.0, recent_round_s=1.5 * step_time(base, 24.0), recent_round_tokens=24.0, recent_round_ts=99.0
    )
    newcomer = Newcomer(10, 10, STANDARD)

    def predicted(config: PolicyConfig) -> float:
        lb = Balancer(config, CLASSES, "standard", seed=0)
        return lb.decide(newcomer, "k", {"a": measured}, now=100.1).candidates[0].prediction.tpot_s

    modelled = predicted(PolicyConfig(stale_after_s=1.0))  # the default: the model alone
    assert modelled == pytest.approx(
        predict(replica_state("a", measured, base, CLASSES, STANDARD, 0.0), newcomer).tpot_s
    )
    assert predicted(PolicyConfig(stale_after_s=1.0, calibrate_tpot=True)) == pytest.approx(1.5 * modelled)


def test_a_kv_cache_reported_in_tokens_is_read_as_pages():
    sglang = {k: v for k, v in stats(1.0).items() if not k.startswith("kv_")}
    sglang |= {"kv_total_tokens": 1024, "kv_headroom": 0.25}  # SGLang's load report
    state = replica_state("s", sglang, speed_of(sglang, 0.5), CLASSES, STANDARD, 0.0)
    assert (state.total_pages, state.free_pages, state.page_size) == (64, 16, 16)


def test_a_request_asked_about_again_holds_no_phantom_slot():
    lb = balancer()
    one_slot = stats(100.0, running_requests=0, queued_requests=0, remaining_tokens=[], max_num_seqs=1)
    request = Newcomer(10, 10, STANDARD)
    assert lb.decide(request, "k", {"a": one_slot}, now=100.1).ranking == ("a",)
    assert lb.decide(Newcomer(10, 10, STANDARD), "k2", {"a": one_slot}, now=100.1).action == "wait"
    # Serve found "a" full and asks again for "k": its first choice did not happen, it is decided anew.
    full = stats(100.2, running_requests=1, queued_requests=0, remaining_tokens=[5], max_num_seqs=1)
    assert lb.decide(request, "k", {"a": full}, now=100.3).action == "wait"
    assert lb.ledger.in_flight("a") == 0
    # The slot frees: a waiting request is not kept out by the other's earlier choice.
    assert lb.decide(
        Newcomer(10, 10, STANDARD), "k2", {"a": one_slot | {"ts": 100.4}}, now=100.5
    ).ranking == ("a",)
    # A confirmed request stays counted whatever is decided after it.
    lb.routed("a", "k2", request, now=100.6)
    lb.ledger.withdraw("k2")
    assert lb.ledger.in_flight("a") == 1


def test_signals_age_from_the_snapshot_and_never_look_fresher_than_first_seen():
    lb = balancer()
    now = 1000.0
    # A replica whose clock runs 5 s ahead: its snapshot counts as taken when first seen.
    (state,) = lb.states({"r": stats(now + 5.0)}, now)
    assert state.age_s == 0.0
    (state,) = lb.states({"r": stats(now + 5.0)}, now + 2.0)  # the same snapshot, 2 s later: stale
    assert state.age_s == 2.0
    (state,) = lb.states({"r": stats(now - 0.5)}, now + 2.0)  # an older clock: aged by its own ts
    assert state.age_s == 2.5
    (state,) = lb.states({"r": None}, now)
    assert state.speed is None and math.isinf(state.age_s)


def test_a_state_is_kept_between_decisions_while_only_its_age_moves():
    # Age decides only the fresh/stale tier, so the balancer gives it beside the state, which it keeps
    # (not rebuilt per decision) until the replica's stats or the ledger's count for it change.
    lb = balancer()
    replicas = {"a": stats(100.0, running_requests=0), "b": stats(100.0, running_requests=5)}
    fresh = lb.decide(Newcomer(10, 10, STANDARD), "k0", replicas, now=100.5)
    stale = lb.decide(Newcomer(10, 10, STANDARD), "k1", replicas, now=101.5)
    assert fresh.ranking[0] == "a"  # its ledger count changed: a new state for the second decision
    before, after = ({c.state.replica_id: c for c in d.candidates} for d in (fresh, stale))
    assert after["b"].state is before["b"].state and after["a"].state is not before["a"].state
    assert {c.tier for c in before.values()} == {0} and {c.tier for c in after.values()} == {1}
    assert {s["tier"] for s in stale.to_dict()["scores"].values()} == {"stale"}
    assert [s.age_s for s in lb.states(replicas, now=101.5)] == [1.5, 1.5]


def test_decisions_reach_the_trace_with_where_serve_placed_them():
    lb = balancer()
    request = Newcomer(10, 10, STANDARD, key="trace-key")
    idle = {"a": stats(5.0), "b": stats(5.0, running_requests=7)}
    decision = lb.decide(request, "internal-id", idle, now=5.1)
    lb.routed("b", "internal-id", request, now=5.2)
    record = decisions.pop("trace-key")
    assert record["ranking"] == list(decision.ranking) and record["ranking"][0] == "a"
    assert record["placed_on"] == "b" and decisions.pop("trace-key") is None


def test_a_decision_collected_before_serve_confirms_is_placed_where_its_first_event_came_from():
    # On the multiplexed stream a replica's first event can overtake Serve's confirmation (its accept):
    # the ingress then names the replica that answered, and Serve's own word wins where it came first.
    lb = balancer()
    request = Newcomer(10, 10, STANDARD, key="race-key")
    idle = {"a": stats(5.0), "b": stats(5.0, running_requests=7)}
    lb.decide(request, "internal-id", idle, now=5.1)
    assert decisions.pop("race-key", answered_by="a")["placed_on"] == "a"
    lb.routed("a", "internal-id", request, now=5.2)  # too late: collected already, and nothing kept
    assert decisions.pop("race-key") is None
    lb.decide(request, "internal-id-2", idle, now=5.3)
    lb.routed("b", "internal-id-2", request, now=5.4)
    assert decisions.pop("race-key", answered_by="a")["placed_on"] == "b"
    lb.decide(request, "internal-id-3", idle, now=5.5)
    assert "placed_on" not in decisions.pop("race-key")  # nobody knows yet: the trace says so


def test_a_balancer_that_keeps_no_decisions_decides_the_same_and_leaves_the_registry_alone():
    # The simulator's: nobody collects its decisions, so they must not fill the registry.
    keeping, silent = (
        balancer(),
        Balancer(PolicyConfig(stale_after_s=1.0), CLASSES, "standard", seed=0, keep_decisions=False),
    )
    request = Newcomer(10, 10, STANDARD, key="silent-key")
    idle = {"a": stats(5.0), "b": stats(5.0, running_requests=7)}
    decision = silent.decide(request, "internal-id", idle, now=5.1)
    silent.routed("b", "internal-id", request, now=5.2)
    assert decisions.pop("silent-key") is None
    assert keeping.decide(request, "internal-id", idle, now=5.1).ranking == decision.ranking


PAGES = PromptPages(16, ("h0", "h1", "h2", "h3"))  # a shared system prompt's first 4 pages


def idle_stats(ts: float, hashes: tuple[str, ...] = ()) -> dict:
    summary = {"enabled": True, "page_size": 16, "cached_pages": len(hashes), "hashes": list(hashes)}
    return stats(ts, running_requests=0, queued_requests=0, queued_prefill_tokens=0, remaining_tokens=[]) | {
        "prefix_cache": summary
    }


def test_a_pushed_prefix_summary_draws_the_prompts_that_start_with_it():
    lb = balancer()
    replicas = {"a": idle_stats(5.0), "b": idle_stats(5.0, PAGES.hashes[:3])}
    (a, b) = lb.states(replicas, now=5.1)
    assert not a.cached_prefix and set(b.cached_prefix) == {"h0", "h1", "h2"}
    for i in range(5):
        request = Newcomer(80, 10, STANDARD, prefix=PAGES)
        decision = lb.decide(request, f"k{i}", replicas, now=5.1)
        cached = {c.state.replica_id: c.prediction.cached_tokens for c in decision.candidates}
        # b's summary holds 3 pages; once it was sent the whole prompt, the router expects all 4 there.
        assert decision.ranking[0] == "b" and cached == {"a": 0, "b": 48 if i == 0 else 64}
        lb.completed("b", f"k{i}", now=5.1)
    # Another page size names other pages: nothing matches.
    other = Newcomer(80, 10, STANDARD, prefix=PromptPages(32, PAGES.hashes))
    assert {lb.decide(other, f"o{i}", replicas, now=5.1).ranking[0] for i in range(8)} == {"a", "b"}


def test_the_router_remembers_the_prefixes_it_sent_until_the_summary_can_show_them():
    lb = balancer()
    replicas = {"a": idle_stats(5.0), "b": idle_stats(5.0)}
    first = lb.decide(Newcomer(80, 10, STANDARD, prefix=PAGES), "k0", replicas, now=5.1).ranking[0]
    lb.routed(first, "k0", Newcomer(80, 10, STANDARD, prefix=PAGES), now=5.1)
    lb.completed(first, "k0", now=5.3)  # done before any snapshot showed its pages
    for i in range(1, 6):
        now = 5.3 + 0.1 * i
        request = Newcomer(80, 10, STANDARD, prefix=PAGES)
        assert lb.decide(request, f"k{i}", replicas, now=now).ranking[0] == first
        lb.completed(first, f"k{i}", now=now)
    # Past PREFIX_MEMORY_S only the pushed summaries speak: here neither holds it (evicted).
    later = 5.8 + PREFIX_MEMORY_S + 0.1
    states = lb.states({name: idle_stats(later) for name in "ab"}, now=later)
    assert [bool(s.cached_prefix) for s in states] == [False, False]


def test_a_replica_without_prefix_caching_is_not_remembered_as_holding_anything():
    lb = balancer()
    off = stats(5.0, running_requests=0, queued_requests=0, remaining_tokens=[]) | {
        "prefix_cache": {"enabled": False}
    }
    replicas = {"a": off, "b": off}
    first = lb.decide(Newcomer(80, 10, STANDARD, prefix=PAGES), "k0", replicas, now=5.1).ranking[0]
    lb.completed(first, "k0", now=5.2)
    (state,) = lb.states({first: off}, now=5.3)
    assert not state.cached_prefix


def test_the_prompt_inflow_is_measured_from_the_replicas_admitted_prompt_tokens_and_smoothed():
    lb = balancer()

    def admitted(ts: float, tokens: int) -> dict:
        return stats(ts, prefix_cache={"enabled": False, "prompt_tokens": tokens})

    (state,) = lb.states({"r": admitted(10.0, 5000)}, 10.0)
    assert state.prefill_rate == 0.0  # one count: no rate yet
    (state,) = lb.states({"r": admitted(10.5, 6000)}, 10.5)
    assert state.prefill_rate == pytest.approx(2000.0)  # the first reading is taken as it is
    (state,) = lb.states({"r": admitted(10.5, 6000)}, 10.9)  # the same version: unchanged
    assert state.prefill_rate == pytest.approx(2000.0)
    (state,) = lb.states({"r": admitted(12.5, 6000)}, 12.5)  # nothing for 2 s: halfway to 0
    assert PREFILL_RATE_HALF_LIFE_S == 2.0 and state.prefill_rate == pytest.approx(1000.0)
    (state,) = lb.states({"r": admitted(13.0, 10)}, 13.0)  # a restarted count: the estimate stays
    assert state.prefill_rate == pytest.approx(1000.0)
    (state,) = lb.states({"r": stats(13.5)}, 13.5)  # a backend that does not count: the estimate stays
    assert state.prefill_rate == pytest.approx(1000.0)


def test_a_replicas_speed_is_smoothed_over_its_readings():
    before = speed_of(stats(10.0), 0.5)
    reading = replace(
        before,
        sps=SpsTable(before.sps.points, (60.0, 12.0)),
        acceptance=before.acceptance + 0.2,
        overhead=2.25,
        calibration=2.0,
    )
    half = smooth_speed(before, reading, 1.0, 1.0)  # one half-life: halfway
    assert half.sps.rates == pytest.approx((80.0, 16.0)) and half.overhead == pytest.approx(1.75)
    assert half.acceptance == pytest.approx(before.acceptance + 0.1) and half.calibration == pytest.approx(
        1.5
    )
    assert smooth_speed(before, reading, 2.0, 1.0).acceptance == pytest.approx(before.acceptance + 0.15)
    # The first reading, no time between, no half-life, another table: the reading as it is.
    other = replace(reading, sps=SpsTable((1, 128), (60.0, 12.0)))
    for args in ((None, reading, 1.0, 1.0), (before, reading, 0.0, 1.0), (before, reading, 1.0, 0.0)):
        assert smooth_speed(*args) is reading
    assert smooth_speed(before, other, 1.0, 1.0) is other


def test_the_balancer_smooths_each_replicas_speed_from_one_stats_version_to_the_next():
    def acceptance(half_life_s: float) -> float:
        lb = Balancer(PolicyConfig(speed_half_life_s=half_life_s), CLASSES, "standard", seed=0)
        lb.states({"r": stats(10.0, recent_tau=2.0)}, 10.0)
        lb.states({"r": stats(10.5, recent_tau=4.0)}, 10.5)
        (state,) = lb.states({"r": stats(10.5, recent_tau=4.0)}, 10.9)  # the same version: kept
        return state.speed.acceptance

    low, high = fit_acceptance(2.0, 4.0, 0.5), fit_acceptance(4.0, 4.0, 0.5)
    assert acceptance(0.0) == pytest.approx(high)  # each reading as it is
    assert acceptance(0.5) == pytest.approx((low + high) / 2)  # half a second: one half-life


def test_equal_replicas_share_requests_though_one_reads_faster_for_a_while():
    """Two identical replicas; for 2 s one measures tau 2.6 and the other 1.4 (which requests happened
    to run there), then both 1.8 again. A request a reading, each tight enough that slack decides: read
    as it is, the lucky replica draws 10 of 12; smoothed over a second, 8."""
    sla = Sla("interactive", ttft_s=1.0, tpot_s=0.016, priority=0, may_shed=True)
    idle = dict(
        running_requests=0,
        queued_requests=0,
        queued_prefill_tokens=0,
        remaining_tokens=[],
        running_by_class={},
        adaptive_verify=False,
        draft_budget={},
        max_num_seqs=32,
        kv_unreserved_pages=4000,
        kv_total_pages=4000,
    )

    def shares(half_life_s: float) -> Counter:
        lb = Balancer(PolicyConfig(speed_half_life_s=half_life_s), {"interactive": sla}, "interactive")
        sent: Counter = Counter()
        for k in range(12):
            now = 100.0 + 0.25 * k
            tau_a, tau_b = (1.8, 1.8) if k < 4 else (2.6, 1.4)
            readings = {"a": stats(now, recent_tau=tau_a, **idle), "b": stats(now, recent_tau=tau_b, **idle)}
            newcomer = Newcomer(20, 20, sla)
            chosen = lb.decide(newcomer, f"k{k}", readings, now).ranking[0]
            lb.routed(chosen, f"k{k}", newcomer, now)  # stays on the ledger: the readings never hold it
            sent[chosen] += 1
        return sent

    assert shares(0.0) == {"a": 10, "b": 2}
    assert shares(1.0) == {"a": 8, "b": 4}
