"""The SLA policy on hand-built replica states: exact predictions, filters, the pick, shedding, ties."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest

from router.policy import (
    Newcomer,
    PolicyConfig,
    PromptPages,
    ReplicaState,
    Sla,
    cached_tokens,
    decide,
    exclusion,
    first_slot,
    inflow_rate,
    predict,
    resident_backlog,
    time_until_room,
    ttft,
)
from router.speed import Speed, SpsTable, prefill_per_step, step_time, tau, tpot, verify_length

# SPS falls from 100 steps/s at one token to 5 at 1024: a small model's shape.
TABLE = SpsTable((1, 8, 32, 128, 512, 1024), (100.0, 90.0, 60.0, 30.0, 10.0, 5.0))
FAST = Speed(TABLE, 1024, acceptance=0.8, draft_cap=7, adaptive=True)  # a drafter at tau ~ 4
PLAIN = Speed(TABLE, 1024, acceptance=0.0, draft_cap=0, adaptive=False)  # no speculation
LOOSE = Sla("batch", ttft_s=60.0, tpot_s=2.0, priority=2)
CONFIG = PolicyConfig()


def replica(name: str, speed: Speed | None = FAST, **fields) -> ReplicaState:
    base = dict(free_pages=1000, total_pages=1000, page_size=16, max_num_seqs=256, age_s=0.0)
    return ReplicaState(name, speed, **(base | fields))


def request(sla: Sla = LOOSE, prompt: int = 100, max_tokens: int = 50) -> Newcomer:
    return Newcomer(prompt, max_tokens, sla)


def test_tau_and_the_verify_length_each_scheduler_picks():
    assert tau(0.5, 0) == 1.0 and tau(0.5, 2) == pytest.approx(1.75) and tau(1.0, 3) == 4.0
    # Adaptive: the l maximising tau(l) * SPS(n (1 + l)): all 7 drafts at n = 1, fewer as n grows.
    assert verify_length(FAST, 1) == 7
    at_64 = {n: tau(0.8, n) * TABLE(64 * (1 + n)) for n in range(8)}
    assert verify_length(FAST, 64) == max(at_64, key=at_64.get) == 3
    # A fixed window verifies its cap, cut so the step's budget holds every anchor and draft.
    fixed = replace(FAST, adaptive=False)
    assert verify_length(fixed, 64) == 7 and verify_length(fixed, 200) == (1024 - 200) // 200 == 4
    assert verify_length(replace(fixed, step_draft_cap=40), 10) == 4  # the step's draft budget
    assert verify_length(replace(fixed, class_caps={"batch": 2}), 10, "batch") == 2
    assert verify_length(PLAIN, 10) == 0


def test_the_verify_length_is_the_first_best_over_every_speed_and_batch():
    # verify_length's loop against the plain argmax it replaced (max() keeps the first of equal rates),
    # over random tables and acceptances, and a table flat enough that lengths tie exactly.
    rng = random.Random(7)
    flat = SpsTable((1, 4096), (50.0, 50.0))
    speeds = [Speed(flat, 1024, acceptance=0.0, draft_cap=7)]
    for _ in range(60):
        rates = sorted((rng.uniform(1, 200) for _ in range(5)), reverse=True)
        table = SpsTable((1, 16, 64, 256, 1024), tuple(rates))
        speeds.append(Speed(table, 1024, rng.choice((0.0, 0.3, 0.7, 0.95)), draft_cap=rng.randint(0, 9)))
    for speed in speeds:
        for batch in (1, 2, 5, 16, 40, 100, 300, 1023):
            cap = max(0, min(speed.draft_cap, (1024 - batch) // batch))
            first_best = max(
                range(cap + 1), key=lambda n: tau(speed.acceptance, n) * speed.sps(batch * (1 + n))
            )
            assert verify_length(speed, batch) == first_best
    assert verify_length(speeds[0], 3) == 0  # acceptance 0 on a flat table: every length ties


def test_tpot_is_tau_times_sps_at_the_batch_tokens():
    # n = 16: l = 3 gives tau 2.952 at SPS(64) = 50 (147.6 tokens/s); l = 4 gives tau 3.3616 at
    # SPS(80) = 60 - 30 * 48 / 96 = 45 (151.3); l = 5 gives 3.68928 at SPS(96) = 40 (147.6): l = 4.
    assert verify_length(FAST, 16) == 4
    assert tpot(FAST, 16) == pytest.approx(1 / (3.3616 * 45.0))
    assert tpot(PLAIN, 16) == pytest.approx(1 / TABLE(16))
    overhead = replace(PLAIN, overhead=1.5)  # a step 1.5x its forward: drafting, bookkeeping
    assert tpot(overhead, 16) == pytest.approx(1.5 / TABLE(16))


def test_a_calibrated_replica_is_predicted_as_slow_as_it_measured():
    # Its decode steps measured 1.5x the model's: every decode-only TPOT 1.5x, the verify length as
    # before (a constant factor moves no maximum); the first token is priced by the prefill model.
    slow = replace(FAST, calibration=1.5)
    for batch in (1, 16, 64):
        assert verify_length(slow, batch) == verify_length(FAST, batch)
        assert tpot(slow, batch) == pytest.approx(1.5 * tpot(FAST, batch))
    newcomer = request(Sla("interactive", ttft_s=60.0, tpot_s=0.05))
    measured, modelled = (
        predict(replica("a", slow, running=4), newcomer),
        predict(replica("a", running=4), newcomer),
    )
    assert measured.tpot_s == pytest.approx(1.5 * modelled.tpot_s)
    assert measured.tpot_others_s == pytest.approx(1.5 * modelled.tpot_others_s)
    assert measured.ttft_s == modelled.ttft_s
    # Predicting the prefill in the steps itself, the calibration (which holds the recent prefill) is
    # not applied on top of it.
    assert tpot(slow, 16, prefill=100.0) == tpot(FAST, 16, prefill=100.0)


def test_a_replica_measured_slower_than_its_table_loses_the_tight_requests():
    # Same table, same load; one measured its decode steps 1.5x slower than the table says. A TPOT
    # target between the two predictions: only the measured-fast one meets it.
    fast, slow = replica("fast", FAST, running=4), replica("slow", replace(FAST, calibration=1.5), running=4)
    target = 1.25 * tpot(FAST, 5)
    tight = request(Sla("interactive", ttft_s=60.0, tpot_s=target, may_shed=True))
    for seed in range(5):
        decision = decide([slow, fast], tight, CONFIG, random.Random(seed))
        assert decision.ranking == ("fast", "slow") and decision.reason == "meets the SLA"
    # Both slow: no replica meets it, and a class that may shed is refused.
    assert decide([slow, replace(slow, replica_id="slow2")], tight, CONFIG, random.Random(0)).action == "shed"


def test_ttft_counts_the_step_in_flight_and_the_prefill_ahead():
    # Idle: one step of the 100-token prompt.
    assert ttft(replica("a", PLAIN), 100) == pytest.approx(1 / TABLE(100))
    # 24 decoding (1 token each): 1000 prefill tokens per step; 1500 queued + 100 = 2 full steps of 1024,
    # plus half of the step running now (24 decode + 1000 prefill tokens): 2.5 steps at 5 steps/s.
    busy = replica("a", PLAIN, running=24, queued=3, queued_prefill_tokens=1500)
    assert ttft(busy, 100) == pytest.approx(2.5 / 5.0)


def test_ttft_remembered_per_speed_answers_each_replica_state_as_computed_afresh():
    # ttft keeps its replica-only part per Speed: states sharing one Speed but differing in what that
    # part reads (running, queued prefill, whether a step runs) must each get their own answer.
    speed = Speed(TABLE, 1024, acceptance=0.8, draft_cap=7, adaptive=True)
    states = [
        replica("a", speed, running=r, queued=q, queued_prefill_tokens=p)
        for r in (0, 3, 24)
        for q, p in ((0, 0), (1, 0), (2, 700), (0, 700))
    ]
    expected = [
        (state, prompt, ttft(replace(state, speed=replace(speed)), prompt))  # a Speed remembering nothing
        for state in states
        for prompt in (1, 100, 3000)
    ]
    for _ in range(2):  # asked again, in another order, from the same Speed: the same answers
        for state, prompt, want in expected:
            assert ttft(state, prompt) == want
        expected.reverse()
    assert len({round(want, 12) for _, _, want in expected}) > len(states)


def test_a_replica_with_a_full_kv_cache_is_never_chosen():
    need = request(prompt=100, max_tokens=60)  # 160 tokens: 10 pages of 16
    full = replica("full", free_pages=9)  # fast and idle, one page short
    busy = replica("busy", PLAIN, running=20)
    decision = decide([full, busy], need, CONFIG, random.Random(0))
    assert decision.action == "route" and decision.ranking == ("busy",)
    assert decision.excluded == {"full": "no KV room"}
    # With exactly the pages it needs it is the pick again.
    assert decide([replace(full, free_pages=10), busy], need, CONFIG, random.Random(0)).ranking[0] == "full"
    # No KV room anywhere: refused with a hint whatever the class, as the engine refuses it.
    both_full = [full, replace(busy, free_pages=0)]
    shed = decide(both_full, need, CONFIG, random.Random(0))
    assert shed.action == "shed" and shed.retry_after_s >= CONFIG.min_retry_s
    assert shed.excluded == {"full": "no KV room", "busy": "no KV room"}


def test_a_full_replica_makes_a_patient_class_wait_and_a_shedding_one_wait_only_while_in_time():
    slots_full = replica("busy", PLAIN, running=8, max_num_seqs=8, remaining_tokens=tuple(range(8)))
    wait = decide([slots_full, replica("full", free_pages=0)], request(), CONFIG, random.Random(0))
    assert wait.action == "wait" and wait.ranking == ()
    # A class that may shed waits too while a slot frees in time for its first token: here the first
    # request finishes at once (0 tokens left), and the newcomer's TTFT is a few steps.
    interactive = Sla("interactive", ttft_s=0.5, tpot_s=2.0, may_shed=True)
    first = ttft(slots_full, 100)
    assert time_until_room(slots_full, request(interactive)) == 0.0 and first < 0.5
    assert decide([slots_full], request(interactive), CONFIG, random.Random(0)).action == "wait"
    # Without the slot wait (PolicyConfig.slot_wait, for an A/B in bench/route.py) it is refused at once;
    # the patient class still waits.
    no_wait = replace(CONFIG, slot_wait=False)
    assert decide([slots_full], request(interactive), no_wait, random.Random(0)).action == "shed"
    assert decide([slots_full], request(), no_wait, random.Random(0)).action == "wait"
    # It has waited most of its target already (waited_s): no slot can come in time, refused.
    late = decide([slots_full], request(interactive), CONFIG, random.Random(0), waited_s=0.5 - first / 2)
    assert late.action == "shed" and late.retry_after_s is not None
    # The first slot frees only after 400 more tokens: too late for its 0.5 s, refused at once.
    slow_to_free = replace(slots_full, remaining_tokens=tuple(range(400, 408)))
    assert time_until_room(slow_to_free, request(interactive)) > 0.5
    assert decide([slow_to_free], request(interactive), CONFIG, random.Random(0)).action == "shed"


def test_the_time_a_request_waited_counts_in_its_ttft_slack():
    interactive = Sla("interactive", ttft_s=1.0, tpot_s=2.0, may_shed=True)
    idle = replica("idle", PLAIN)
    fresh = predict(idle, request(interactive))
    waited = predict(idle, request(interactive), waited_s=0.5)
    assert waited.ttft_s == fresh.ttft_s  # the prediction itself is from now
    assert waited.slack == pytest.approx(fresh.slack - 0.5)  # its TTFT binds: 1 - (0.5 + ttft)
    # Waited past its target: no replica can meet it, a class that may shed is refused.
    assert decide([idle], request(interactive), CONFIG, random.Random(0), waited_s=1.0).action == "shed"


def test_a_fast_replica_takes_more_load_until_its_tpot_meets_the_slow_ones():
    fast, slow = replica("fast", FAST), replica("slow", PLAIN)
    tight = Sla("interactive", ttft_s=60.0, tpot_s=0.05)  # slack decided by TPOT alone
    config = PolicyConfig(tie_margin=0.0, ample_slack=1.0)  # every bit of slack counts
    rng = random.Random(0)
    sent = {"fast": 0, "slow": 0}
    for _ in range(100):
        decision = decide([fast, slow], request(tight), config, rng)
        chosen = decision.ranking[0]
        sent[chosen] += 1
        fast, slow = (
            (replace(fast, running=fast.running + 1), slow)
            if chosen == "fast"
            else (
                fast,
                replace(slow, running=slow.running + 1),
            )
        )
    assert sent["fast"] > 2 * sent["slow"] > 0
    # Balanced: neither replica's last request would have been better off on the other one.
    assert tpot(FAST, fast.running) <= tpot(PLAIN, slow.running + 1)
    assert tpot(PLAIN, slow.running) <= tpot(FAST, fast.running + 1)


def test_comfortably_fast_replicas_share_by_load_until_speed_decides_the_targets():
    fast, slow = replica("fast", FAST), replica("slow", PLAIN)
    tight = Sla("interactive", ttft_s=60.0, tpot_s=0.05)
    rng, picks = random.Random(0), []
    for _ in range(300):
        chosen = decide([fast, slow], request(tight), CONFIG, rng).ranking[0]
        picks.append(chosen)
        fast, slow = (replace(s, running=s.running + (s.replica_id == chosen)) for s in (fast, slow))
    # Both meet the target with half of it to spare: turn and turn about, as a least-loaded router.
    assert all(picks[2 * k : 2 * k + 2].count("fast") == 1 for k in range(40))
    assert tpot(PLAIN, 40) < 0.5 * tight.tpot_s
    # Past that, the slow replica's slack runs short first, and the fast one takes the rest.
    assert picks.count("fast") > picks.count("slow") + 40
    assert tpot(PLAIN, slow.running + 1) > 0.5 * tight.tpot_s


def test_shedding_only_when_no_replica_can_meet_the_class():
    interactive = Sla("interactive", ttft_s=1.0, tpot_s=0.012, may_shed=True)
    crowded = replica("crowded", PLAIN, running=30, remaining_tokens=tuple(range(10, 40)))
    idle = replica("idle", PLAIN)
    # tpot(PLAIN, 31) ~ 16 ms, tpot(PLAIN, 1) = 10 ms: only the idle one meets it, and it is chosen.
    assert tpot(PLAIN, 31) > 0.012 > tpot(PLAIN, 1)
    routed = decide([crowded, idle], request(interactive), CONFIG, random.Random(0))
    assert routed.action == "route" and routed.ranking[0] == "idle"
    assert predict(idle, request(interactive)).slack >= 0 > predict(crowded, request(interactive)).slack
    # Both crowded: refused, with the time until the first could take it within the SLA.
    shed = decide(
        [crowded, replace(crowded, replica_id="c2")], request(interactive), CONFIG, random.Random(0)
    )
    assert shed.action == "shed" and shed.ranking == ()
    assert shed.retry_after_s == pytest.approx(time_until_room(crowded, request(interactive)))
    # A class that may not shed goes where its slack is largest instead.
    patient = replace(interactive, may_shed=False)
    fuller = replace(crowded, replica_id="fuller", running=40, remaining_tokens=())
    kept = decide([fuller, crowded], request(patient), CONFIG, random.Random(0))
    assert (
        kept.action == "route" and kept.ranking == ("crowded", "fuller") and not kept.candidates[0].feasible
    )


def test_retry_hint_is_when_the_soonest_finishers_leave_room():
    # 30 running at 1 token/step; each request leaves as its tokens run out: 10, 11, ... tokens left.
    crowded = replica("crowded", PLAIN, running=30, remaining_tokens=tuple(range(10, 40)))
    sla = Sla("interactive", ttft_s=1.0, tpot_s=0.012, may_shed=True)
    per_token = tpot(PLAIN, 30)
    # Feasible again once the batch is small enough that TPOT(n + 1) <= 12 ms.
    n = next(n for n in range(30, -1, -1) if tpot(PLAIN, n + 1) <= 0.012)
    finishers = 30 - n
    expected = (10 + finishers - 1) * per_token
    assert time_until_room(crowded, request(sla)) == pytest.approx(expected)
    # The scan stops once the wait cannot beat `within` (another replica's): inf then, else the same.
    assert time_until_room(crowded, request(sla), within=expected * 1.01) == pytest.approx(expected)
    assert time_until_room(crowded, request(sla), within=expected * 0.99) == math.inf
    # The shed decision takes the soonest replica ("crowded": 10 tokens left at the head against 20),
    # clamped; the order the replicas come in is no matter.
    later = replace(crowded, replica_id="later", remaining_tokens=tuple(range(20, 50)))
    for fleet in ([crowded, later], [later, crowded]):
        tighter = request(replace(sla, tpot_s=tpot(PLAIN, 31) * 0.99))  # neither meets it now
        assert time_until_room(later, tighter) > time_until_room(crowded, tighter)
        decision = decide(fleet, tighter, CONFIG, random.Random(0))
        assert decision.action == "shed"
        assert decision.retry_after_s == pytest.approx(
            max(CONFIG.min_retry_s, time_until_room(crowded, tighter))
        )
    # Targets no idle replica can meet: no wait helps.
    assert time_until_room(crowded, request(replace(sla, tpot_s=0.001))) == math.inf


def test_the_wait_for_room_is_the_plain_scans_over_random_replicas_and_long_prompts():
    # time_until_room checks the newcomer's TTFT before the full prediction: the same waits as the plain
    # scan (predict at every moment) over random replicas, prompts long enough that the TTFT binds, and
    # cached prefixes.
    rng = random.Random(11)
    pages = PromptPages(16, tuple(f"h{i}" for i in range(8)))
    checked = set()
    for _ in range(300):
        running = rng.randint(0, 120)
        state = replica(
            "r",
            rng.choice((FAST, PLAIN)),
            running=running,
            queued=rng.randint(0, 3),
            queued_prefill_tokens=rng.choice((0, 200, 3000)),
            free_pages=rng.randint(0, 400),
            total_pages=1000,
            remaining_tokens=tuple(sorted(rng.randint(1, 300) for _ in range(running))),
            running_slas=(LOOSE,),
            cached_prefix=frozenset(pages.hashes[: rng.randint(0, 8)]),
        )
        sla = Sla(
            "interactive", ttft_s=rng.choice((0.3, 1.0, 1.3, 2.0, 5.0)), tpot_s=rng.choice((0.01, 0.05))
        )
        newcomer = Newcomer(rng.choice((50, 2000, 6000, 16384)), rng.choice((1, 100)), sla, prefix=pages)
        want, missed = math.inf, False
        for finished in range(state.load + 1):
            left = sorted(
                (*state.remaining_tokens, *[newcomer.max_tokens] * (state.load - len(state.remaining_tokens)))
            )
            per_token = tpot(state.speed, max(state.load, 1))
            drain = ttft(state, 0) if state.queued_prefill_tokens else 0.0
            used = (state.total_pages - state.free_pages) / state.load if state.load else 0.0
            after = replace(
                state,
                running=state.load - finished,
                queued=0,
                queued_prefill_tokens=0,
                free_pages=state.free_pages + round(finished * used),
                remaining_tokens=tuple(left[finished:]),
            )
            prediction = predict(after, newcomer) if exclusion(after, newcomer) is None else None
            if prediction is not None and prediction.slack >= 0:
                want = max(drain, left[finished - 1] * per_token) if finished else drain
                checked.add("fits after its TTFT missed" if missed else "fits")
                break
            missed = missed or (prediction is not None and prediction.ttft_s > sla.ttft_s)
        else:
            checked.add("never")
        assert time_until_room(state, newcomer) == want
    assert checked == {"fits", "fits after its TTFT missed", "never"}


def test_a_request_that_fits_no_cache_is_refused_at_once_whatever_its_class():
    small = replica("small", total_pages=5, free_pages=5)
    decision = decide([small], request(prompt=100, max_tokens=60), CONFIG, random.Random(0))
    assert decision.action == "shed" and decision.retry_after_s == 0.0


def test_harm_to_running_requests_counts_for_classes_as_important():
    # "a" runs interactive requests right at their target; one more would push them past it.
    target = (tpot(PLAIN, 4) + tpot(PLAIN, 5)) / 2
    interactive = Sla("interactive", ttft_s=1.0, tpot_s=target, priority=0)
    a = replica("a", PLAIN, running=3, running_slas=(interactive,))
    b = replica("b", PLAIN, running=6)
    batch = request(Sla("batch", ttft_s=60.0, tpot_s=2.0, priority=2))
    assert decide([a, b], batch, CONFIG, random.Random(0)).ranking[0] == "b"
    # An interactive newcomer weighs the harm to its own class too: "a" would break them; "b" has room.
    assert (
        decide([a, b], request(replace(interactive, tpot_s=0.02)), CONFIG, random.Random(0)).ranking[0] == "b"
    )
    # Harm to a less important class does not count: batch requests on "a" do not keep an interactive
    # newcomer away from the replica that serves it best.
    a_batch = replace(a, running_slas=(Sla("batch", 60.0, target, priority=2),))
    quick = request(Sla("interactive", ttft_s=1.0, tpot_s=0.1, priority=0))
    assert decide([a_batch, b], quick, CONFIG, random.Random(0)).ranking[0] == "a"


def test_stale_and_unknown_replicas_rank_after_fresh_ones():
    fresh = replica("fresh", PLAIN, running=10)
    stale = replica("stale", FAST, age_s=CONFIG.stale_after_s + 0.1)  # looks idle and fast, but old news
    unknown = ReplicaState("new", None)
    decision = decide([stale, unknown, fresh], request(), CONFIG, random.Random(0))
    assert decision.ranking == ("fresh", "stale", "new")
    # When the fresh one cannot meet the SLA (11.6 ms per token), the stale one that can is preferred.
    sla = Sla("interactive", ttft_s=1.0, tpot_s=0.0105)
    assert tpot(PLAIN, 11) > 0.0105
    assert decide([stale, fresh], request(sla), CONFIG, random.Random(0)).ranking[0] == "stale"
    # Before any stats arrive, every replica is unknown and the least loaded is taken.
    new = [ReplicaState("n1", None, running=2), ReplicaState("n2", None, running=1)]
    assert decide(new, request(), CONFIG, random.Random(0)).ranking[0] == "n2"


def test_ties_spread_load_and_are_seeded():
    def assign(seed: int) -> list[str]:
        states = [replica(f"r{i}") for i in range(4)]
        rng, picks = random.Random(seed), []
        for _ in range(40):
            chosen = decide(states, request(), CONFIG, rng).ranking[0]
            picks.append(chosen)
            states = [replace(s, running=s.running + 1) if s.replica_id == chosen else s for s in states]
        return picks

    picks = assign(0)
    assert {r: picks.count(r) for r in set(picks)} == {"r0": 10, "r1": 10, "r2": 10, "r3": 10}
    assert assign(0) == picks and assign(1) != picks


def test_replicas_of_different_sizes_fill_in_proportion_to_their_slots():
    # Both comfortably fast (ample slack: a tie), 8 slots against 2: the least loaded *for its size*
    # wins, so the small one is not filled first and keeps a slot while the big one has room.
    def assign(requests: int) -> dict[str, int]:
        states = [replica("big", FAST, max_num_seqs=8), replica("small", FAST, max_num_seqs=2)]
        rng = random.Random(0)
        for _ in range(requests):
            chosen = decide(states, request(), CONFIG, rng).ranking[0]
            states = [replace(s, running=s.running + 1) if s.replica_id == chosen else s for s in states]
        return {s.replica_id: s.running for s in states}

    assert assign(5) == {"big": 4, "small": 1}
    assert assign(10) == {"big": 8, "small": 2}  # then both are full
    # 2 of 8 against 1 of 2: absolute load would pick the small one; its share in use is twice the big's.
    states = [
        replica("big", FAST, max_num_seqs=8, running=2),
        replica("small", FAST, max_num_seqs=2, running=1),
    ]
    assert (states[0].occupancy, states[1].occupancy) == (0.25, 0.5)
    assert {decide(states, request(), CONFIG, random.Random(seed)).ranking[0] for seed in range(10)} == {
        "big"
    }


def test_a_tight_class_waits_for_a_small_batch_soon_rather_than_a_large_one_now():
    # The big replica has room at a batch of 7; the small one is full, its first request 3 tokens from
    # done. TTFT is loose and TPOT tight: the small batch in a few ms beats the big batch now.
    big = replica("big", FAST, max_num_seqs=8, running=6, remaining_tokens=(40,) * 6)
    small = replica("small", FAST, max_num_seqs=2, running=2, remaining_tokens=(3, 30))
    tight = Sla("interactive", ttft_s=2.0, tpot_s=0.0061, may_shed=True)
    now_big = predict(big, request(tight))
    assert now_big.slack == pytest.approx((0.0061 - tpot(FAST, 7)) / 0.0061)  # 0.25: feasible
    wait_s, freed = first_slot(small, request(tight), None)
    assert wait_s == pytest.approx(3 * tpot(FAST, 2)) and freed.load == 1 and freed.remaining_tokens == (30,)
    later = predict(freed, request(tight), waited_s=wait_s)
    assert later.slack >= CONFIG.ample_slack  # a batch of 2: half the target to spare

    def action(config: PolicyConfig, *states: ReplicaState, newcomer: Newcomer | None = None) -> str:
        decision = decide(list(states), newcomer or request(tight), config, random.Random(0))
        return decision.ranking[0] if decision.action == "route" else decision.action

    # With the rule off (wait_gain inf) it goes where there is room now.
    assert action(replace(CONFIG, wait_gain=math.inf), big, small) == "big"
    waits = CONFIG  # the default gain, 0.1
    assert waits.wait_gain == 0.1
    decision = decide([big, small], request(tight), waits, random.Random(0))
    assert decision.action == "wait" and "replica small" in decision.reason
    assert decision.excluded == {"small": "no free sequence slot"}
    # Not worth it: the gain asked for exceeds the 0.25 on offer.
    assert action(replace(CONFIG, wait_gain=0.3), big, small) == "big"
    # The slot frees too late: 600 tokens at a batch of 2 eat the TTFT slack the wait would win.
    assert action(waits, big, replace(small, remaining_tokens=(600, 700))) == "big"
    # A loose class has ample slack on the big replica now: a wait gains it nothing.
    assert action(waits, big, small, newcomer=request()) == "big"
    # A full replica whose signals are stale is not waited for (its slot may be taken already).
    stale = decide([big, small], request(tight), waits, random.Random(0), ages=[0.0, 5.0])
    assert stale.action == "route" and stale.ranking[0] == "big"
    with pytest.raises(ValueError, match="wait_gain"):
        PolicyConfig(wait_gain=-0.1)


# A prompt's leading pages by name (the ingress hashes them: dspark.prefix_cache.route_hashes).
PAGES = PromptPages(16, tuple(f"p{k}" for k in range(64)))  # 64 pages of 16: 1,024 tokens


def prefixed(sla: Sla = LOOSE, prompt: int = 3000, max_tokens: int = 50) -> Newcomer:
    return Newcomer(prompt, max_tokens, sla, prefix=PAGES)


def test_a_cached_prefix_is_prefill_saved():
    holds_60 = frozenset(PAGES.hashes[:60])
    warm = replica("warm", PLAIN, running=4, cached_prefix=holds_60)
    assert cached_tokens(warm, prefixed()) == 960
    assert predict(warm, prefixed()).ttft_s == ttft(warm, 3000 - 960)
    assert predict(warm, prefixed()).cached_tokens == 960
    # Only a leading run counts (a page's K/V depend on every page before it), at the same page size.
    assert cached_tokens(replace(warm, cached_prefix=frozenset(PAGES.hashes[1:])), prefixed()) == 0
    assert cached_tokens(replace(warm, page_size=32), prefixed()) == 0
    assert cached_tokens(warm, request(prompt=3000)) == 0  # a prompt not hashed: nothing predicted
    cold = replica("cold", PLAIN, running=2)
    sla = Sla("interactive", ttft_s=0.2, tpot_s=1.0)  # the cold prefill (~0.5 s) misses it
    assert decide([cold, warm], prefixed(sla), CONFIG, random.Random(0)).ranking[0] == "warm"


def test_a_replica_holding_the_prefix_wins_when_otherwise_equal():
    # Slack within the tie margin and equal load: the sooner first token decides, every time.
    holder = replica("holder", PLAIN, cached_prefix=frozenset(PAGES.hashes[:8]))
    for seed in range(20):
        for states in ([replica("other", PLAIN), holder], [holder, replica("other", PLAIN)]):
            decision = decide(states, prefixed(prompt=200), CONFIG, random.Random(seed))
            assert decision.ranking[0] == "holder"
    record = decide([holder, replica("other", PLAIN)], prefixed(prompt=200), CONFIG, random.Random(0))
    assert record.to_dict()["scores"]["holder"]["cached_tokens"] == 128
    assert "cached_tokens" not in record.to_dict()["scores"]["other"]
    # Without a prefix to match, equal replicas are a seeded draw again.
    firsts = {
        decide([holder, replica("other", PLAIN)], request(), CONFIG, random.Random(s)).ranking[0]
        for s in range(20)
    }
    assert firsts == {"holder", "other"}


def test_load_still_beats_affinity():
    holds = frozenset(PAGES.hashes)
    # Within the tie margin, the less loaded replica wins whatever it caches.
    busier = replica("holder", PLAIN, running=3, cached_prefix=holds)
    assert decide([busier, replica("idle", PLAIN)], prefixed(), CONFIG, random.Random(0)).ranking[0] == "idle"
    # Overloaded: even skipping 1,024 tokens of prefill, its queue and batch miss a tight class there.
    tight = Sla("interactive", ttft_s=1.0, tpot_s=0.05, may_shed=True)
    loaded = replica("holder", PLAIN, running=40, queued=4, queued_prefill_tokens=4000, cached_prefix=holds)
    decision = decide([loaded, replica("idle", PLAIN)], prefixed(tight), CONFIG, random.Random(0))
    assert decision.ranking == ("idle", "holder")
    assert decision.candidates[1].prediction.cached_tokens == 1024  # all 64 pages, and still too slow


def test_decision_record_names_scores_and_exclusions():
    full = replica("full", free_pages=0)
    decision = decide([full, replica("ok", PLAIN)], request(), CONFIG, random.Random(0))
    record = decision.to_dict()
    assert record["action"] == "route" and record["ranking"] == ["ok"]
    assert record["excluded"] == {"full": "no KV room"}
    assert set(record["scores"]["ok"]) == {"tier", "load", "ttft_ms", "tpot_ms", "tpot_others_ms", "slack"}


# ---- prefill in the decode steps (PolicyConfig.prefill_aware) ----------------------------------------

AWARE = PolicyConfig(prefill_aware=True)


def test_the_prefill_a_step_carries_is_the_fixed_point_of_the_inflow():
    # 16 plain decoders: D = 16. Prompts at 2,000 tokens/s: p = 2000 * T(16 + p), to 1/4096 of the room.
    p = prefill_per_step(PLAIN, 16, 2000.0)
    assert p == pytest.approx(2000.0 * step_time(PLAIN, 16 + p), abs=(1024 - 16) / 4096)
    assert 0 < p < 1024 - 16
    assert prefill_per_step(PLAIN, 16, 0.0) == 0.0
    # An inflow no step can absorb fills every step: the budget binds.
    assert prefill_per_step(PLAIN, 16, 1e6) == 1024 - 16
    # The TPOT of a request in such steps: the step at D + p tokens over the tokens a round gains.
    assert tpot(PLAIN, 16, None, p) == pytest.approx(step_time(PLAIN, 16 + p))
    assert tpot(FAST, 16, None, p) == pytest.approx(step_time(FAST, 16 * 5 + p) / tau(0.8, 4))
    assert tpot(PLAIN, 16, None, p) > tpot(PLAIN, 16)


def test_the_inflow_slows_the_newcomer_and_the_queue_only_its_residents():
    state = replica("a", PLAIN, running=8, queued=1, queued_prefill_tokens=900, remaining_tokens=(40, 50, 60))
    new = request(prompt=100, max_tokens=50)
    plain = predict(state, new)
    aware = predict(state, new, 2000.0)
    inflow = prefill_per_step(PLAIN, 10, 2000.0)
    assert aware.tpot_s == pytest.approx(step_time(PLAIN, 10 + inflow)) and aware.tpot_s > plain.tpot_s
    # The queue (900) and the newcomer's prompt (100) run over the residents' median 50 tokens left.
    assert resident_backlog(state, new, 100) == pytest.approx(1000 / 50)
    assert aware.tpot_others_s == pytest.approx(step_time(PLAIN, 10 + inflow + 20))
    assert aware.ttft_s == plain.ttft_s  # the queue ahead is prefilled before its first token either way
    # decide spreads the inflow it expects as the candidates' mean.
    assert inflow_rate([replace(state, prefill_rate=1000.0), replace(state, prefill_rate=3000.0)]) == 2000.0


def test_a_replica_with_a_heavy_prefill_queue_is_avoided_by_an_interactive_request():
    # Equal load (12) and speed; "heavy" has 4,000 prompt tokens queued, which its interactive residents
    # will decode beside. By decode tokens alone both keep the same slack (a tie that the sooner first
    # token breaks); prefill-aware, the residents' TPOT on "heavy" breaks their target.
    interactive = Sla("interactive", ttft_s=30.0, tpot_s=0.016, priority=0, may_shed=True)
    base = dict(running_slas=(interactive,), prefill_rate=500.0)
    heavy = replica("heavy", PLAIN, running=8, queued=4, queued_prefill_tokens=4000, **base)
    light = replica("light", PLAIN, running=12, **base)
    heavy, light = (replace(s, remaining_tokens=(100,) * s.running) for s in (heavy, light))
    new = request(interactive, prompt=200, max_tokens=100)
    assert predict(heavy, new).slack == predict(light, new).slack
    for seed in range(10):
        for states in ([heavy, light], [light, heavy]):
            decision = decide(states, new, AWARE, random.Random(seed))
            assert decision.ranking == ("light", "heavy")
            scores = {c.state.replica_id: c.prediction for c in decision.candidates}
            assert scores["heavy"].tpot_others_s > interactive.tpot_s >= scores["light"].tpot_others_s
            assert scores["heavy"].slack < 0 <= scores["light"].slack


def test_an_interactive_request_is_shed_when_the_prefill_inflow_breaks_its_target_everywhere():
    tight = Sla("interactive", ttft_s=1.0, tpot_s=0.015, priority=0, may_shed=True)
    fleet = [replica(f"r{i}", PLAIN, running=8, prefill_rate=3000.0) for i in range(3)]
    new = request(tight, prompt=100, max_tokens=50)
    assert tpot(PLAIN, 9) < 0.015  # decode tokens alone: the target looks met
    assert decide(fleet, new, CONFIG, random.Random(0)).action == "route"
    decision = decide(fleet, new, AWARE, random.Random(0))
    assert decision.action == "shed" and decision.retry_after_s >= AWARE.min_retry_s


def test_identical_prefill_loaded_replicas_share_the_load():
    def assign(seed: int) -> list[str]:
        states = [replica(f"r{i}", PLAIN, prefill_rate=1500.0, queued_prefill_tokens=300) for i in range(4)]
        rng, picks = random.Random(seed), []
        for _ in range(40):
            chosen = decide(states, request(), AWARE, rng).ranking[0]
            picks.append(chosen)
            states = [replace(s, running=s.running + 1) if s.replica_id == chosen else s for s in states]
        return picks

    picks = assign(0)
    assert {r: picks.count(r) for r in set(picks)} == {"r0": 10, "r1": 10, "r2": 10, "r3": 10}
    assert assign(0) == picks and assign(1) != picks
