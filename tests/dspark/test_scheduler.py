"""The prefix scheduler and the verify-length policies as pure functions: hand-computed cases, the
early stop, tie-breaking, the prefix property, budget caps, and the baseline modes."""

from __future__ import annotations

import random

import pytest
import torch

from dspark.config import SCHEDULERS, EngineConfig
from dspark.cost_table import CostTable
from dspark.draft_budget import DraftBudget
from dspark.drafter import DraftProposal
from dspark.errors import InvalidRequestError
from dspark.scheduler import (
    RoundRate,
    best_capacity,
    convex_rates,
    pick_top,
    ranked,
    schedule,
    schedule_groups,
    survival,
)
from dspark.verify_policy import (
    ConfidenceThreshold,
    FixedLength,
    ScheduledLength,
    VerifyRound,
    choose_groups,
    make_policy,
    window_limit,
)


def table(rates: dict[int, float]):
    return lambda b: rates[b]


# Two requests: a = [0.9, 0.72] and [0.6, 0.3]. SPS falls, then flattens after B = 5.
ROWS = [survival([0.9, 0.8]), survival([0.6, 0.5])]
SPS = table({2: 10.0, 3: 9.0, 4: 8.0, 5: 6.8, 6: 6.5})


def test_survival_is_the_clamped_running_product():
    assert survival([0.9, 0.8, 0.5]) == pytest.approx([0.9, 0.72, 0.36])
    assert survival([1.5, float("nan"), 0.7]) == [1.0, 0.0, 0.0]
    assert survival([-0.2, 0.9]) == [0.0, 0.0]


def test_algorithm1_hand_computed():
    # B=2: tau=2, theta*=20. (0,1): B=3 tau=2.9 theta=26.1 keep. (0,2): B=4 tau=3.62 theta=28.96 keep.
    # (1,1): B=5 tau=4.22 theta=28.696 <= 28.96: stop.
    assert schedule(ROWS, SPS, step_cap=10) == [2, 0]


def test_early_stop_never_looks_past_a_drop():
    # (1,2) would lift theta to 4.52 * 6.5 = 29.38 > 28.96, but only past the drop at (1,1).
    assert best_capacity(ROWS, 2, SPS, step_cap=10) == 4
    assert pick_top(ROWS, 4) == [2, 2]
    assert schedule(ROWS, SPS, step_cap=10) == [2, 0]


def test_convex_rates_keep_the_envelope_and_lift_points_above_it():
    # Step times 1, 3, 4, 6 at B = 1, 2, 4, 6: the chord from B=1 to B=4 passes 2 at B=2 (3 is above it);
    # 4 -> 6 rises faster than 1 -> 4, so B=4 stays a vertex.
    assert convex_rates([1, 2, 4, 6], [1.0, 1 / 3, 0.25, 1 / 6]) == pytest.approx([1.0, 0.5, 0.25, 1 / 6])
    # A convex table is its own envelope; a lone point or two are too.
    assert convex_rates([1, 2, 3], [1.0, 0.5, 0.25]) == [1.0, 0.5, 0.25]
    assert convex_rates([1], [2.0]) == [2.0] and convex_rates([1, 8], [2.0, 1.0]) == [2.0, 1.0]


def test_the_walk_crosses_a_concave_kink_of_the_step_time():
    # Step time 1 at B=1, then a steep rise to 1.5 and a flat stretch (1.6, 1.7): on the table itself the
    # first draft (tau 1.4 / 1.5 = 0.93 < 1) stops the walk at its local maximum, verifying nothing.
    tab = CostTable([1, 2, 3, 4], [1.0, 1 / 1.5, 1 / 1.6, 1 / 1.7], max_tokens=4)
    rows = [survival([0.4, 1.0, 1.0])]
    assert schedule(rows, tab, step_cap=3) == [0]
    # The envelope's step times are 1, 1 + 0.7/3, 1 + 1.4/3, 1.7: thetas 1.135, 1.227, 1.294 all rise, and
    # on the true table three drafts give 2.2 / 1.7 = 1.294 tokens per time unit against 1.0.
    assert [round(1 / tab.convex(b), 4) for b in (1, 2, 3, 4)] == [1.0, 1.2333, 1.4667, 1.7]
    assert ScheduledLength().choose(VerifyRound([3], rows, 3, tab)) == [3]
    # A bare SPS function is walked as given: the same table's raw rates stop at the kink.
    assert ScheduledLength().choose(VerifyRound([3], rows, 3, lambda b: tab(b))) == [0]


def test_weighing_whole_rounds_verifies_what_the_drafting_pays_for():
    # Step time 1 + 0.2 (B - 1), convex. One request, survival 0.9, 0.5, 0.2. Forward alone: thetas
    # 1.9 / 1.2, 2.4 / 1.4, then 2.6 / 1.6 = 1.625 < 1.714: two drafts. With 2 s of drafting a round:
    # 2.4 / 3.4 = 0.706, then 2.6 / 3.6 = 0.722: the third pays too.
    tab = CostTable([1, 2, 3, 4], [1.0, 1 / 1.2, 1 / 1.4, 1 / 1.6], max_tokens=4)
    rows = [[0.9, 0.5, 0.2]]
    assert ScheduledLength().choose(VerifyRound([3], rows, 3, tab)) == [2]
    assert ScheduledLength().choose(VerifyRound([3], rows, 3, RoundRate(tab, 2.0))) == [3]
    # No drafting cost: the table itself; the walk reads the wrapped table's envelope plus the drafting.
    assert [RoundRate(tab, 0.0)(b) for b in (1, 2, 3, 4)] == pytest.approx([tab(b) for b in (1, 2, 3, 4)])
    kinked = CostTable([1, 2, 3, 4], [1.0, 1 / 1.5, 1 / 1.6, 1 / 1.7], max_tokens=4)
    assert 1 / RoundRate(kinked, 0.5).convex(2) == pytest.approx(1 / kinked.convex(2) + 0.5)


def test_step_cap_and_fixed_tokens():
    assert schedule(ROWS, SPS, step_cap=1) == [1, 0]
    assert schedule(ROWS, SPS, step_cap=0) == [0, 0]
    # Two tokens already committed elsewhere: the walk starts at B=4, theta*=2*8=16; (0,1): 2.9*6.8=19.72
    # keep; (0,2): 3.62*6.5=23.53 keep; the table ends there.
    assert schedule(ROWS, table({4: 8.0, 5: 6.8, 6: 6.5, 7: 1.0}), step_cap=10, fixed_tokens=2) == [2, 0]


def test_ties_go_to_request_then_position_never_token():
    rows = [[0.5], [0.5], [0.5, 0.5]]
    assert ranked(rows) == [(0, 1), (1, 1), (2, 1), (2, 2)]
    assert pick_top(rows, 2) == [1, 1, 0]
    # Same confidences, different tokens: the same lengths; swapped requests: the earlier one wins.
    flat = table(dict.fromkeys(range(1, 20), 1.0))
    a = DraftProposal([3, 4], confidence=torch.tensor([0.5, 1.0]))
    b = DraftProposal([7, 1], confidence=torch.tensor([0.5, 1.0]))
    policy = ScheduledLength()
    for first, second in ((a, b), (b, a)):
        assert policy.choose(VerifyRound.build([first, second], [2, 2], step_cap=3, sps=flat)) == [2, 1]


@pytest.mark.parametrize("seed", range(40))
def test_prefix_property_on_random_rounds(seed):
    """The kept pairs are always a prefix of the ranking, so each request verifies a prefix of its
    draft, theta rises at every kept pair, and the walk stops exactly at the first non-rise."""
    rng = random.Random(seed)
    rows = [
        survival([round(rng.random(), 1) for _ in range(rng.randint(0, 5))]) for _ in range(rng.randint(1, 6))
    ]
    rates, rate = {}, rng.uniform(50, 100)
    for b in range(1, 40):
        rates[b] = rate
        rate *= rng.choice([1.0, 0.99, 0.95, 0.7])  # flat stretches and cliffs
    sps, cap = table(rates), rng.randint(0, 12)
    lengths = schedule(rows, sps, cap)
    order = ranked(rows)
    k = sum(lengths)
    assert k <= cap and all(0 <= n <= len(row) for n, row in zip(lengths, rows))
    assert pick_top(rows, k) == lengths
    tau, theta = float(len(rows)), len(rows) * sps(len(rows))
    for i, (r, j) in enumerate(order[: k + 1]):
        tau += rows[r][j - 1]
        new = tau * sps(len(rows) + i + 1)
        if i < k:
            assert new > theta
            theta = new
        elif k < cap:
            assert new <= theta


def reference_schedule(survivals, sps, step_cap, fixed_tokens=0):
    """Algorithm 1 walked over `ranked` itself, as schedule() did before it sorted positions instead."""
    lengths, tokens = [0] * len(survivals), len(survivals) + fixed_tokens
    tau = float(len(survivals))
    best = tau * sps(tokens)
    for kept, (r, j) in enumerate(ranked(survivals)):
        if kept == step_cap:
            break
        tau, tokens = tau + survivals[r][j - 1], tokens + 1
        theta = tau * sps(tokens)
        if theta <= best:
            break
        lengths[r], best = j, theta
    return lengths


@pytest.mark.parametrize("seed", range(6))
def test_schedule_walks_the_ranking_exactly(seed):
    # Rows of every length (empty ones too), survivals drawn from a few values so ties are everywhere,
    # tables flat (every token pays) and falling, caps that bind and do not: the same lengths as the walk
    # over ranked()'s pairs, tie-break included.
    rng = random.Random(seed)
    tables = [CostTable([1, 64, 256, 1024], [100.0, 100.0, 40.0, 10.0], 2048), lambda b: 50.0]
    for _ in range(300):
        values = [1.0, 0.9, 0.75, 0.5, 0.3, 0.0] if rng.random() < 0.5 else None
        rows = []
        for _ in range(rng.randint(1, 60)):
            confidences = [rng.choice(values) if values else rng.random() for _ in range(rng.randint(0, 8))]
            rows.append(survival(confidences))
        sps = rng.choice(tables)
        walk = getattr(sps, "convex", sps)
        cap, fixed = rng.choice([0, 3, 40, 10_000]), rng.choice([0, 5])
        assert schedule(rows, walk, cap, fixed) == reference_schedule(rows, walk, cap, fixed)


@pytest.mark.parametrize("seed", range(6))
def test_grouped_rows_are_scheduled_as_written_out(seed):
    # Groups of identical rows (the simulator's requests of one domain and window), groups sharing
    # survival values (one domain at two windows: prefixes of one row), rows that repeat a value (a
    # certain or an impossible token), empty groups, caps that bind mid-group and fixed tokens: each
    # group's lengths are schedule()'s on the rows written out, member by member, and so is the policy's.
    rng = random.Random(seed)
    tables = [CostTable([1, 64, 256, 1024], [100.0, 100.0, 40.0, 10.0], 2048), lambda b: 50.0]
    for _ in range(200):
        domains = [survival([rng.choice([0.95, 0.9, 0.7, rng.random()]) for _ in range(7)]) for _ in range(3)]
        if rng.random() < 0.2:
            domains.append(survival([1.0, 0.9, 0.0, 0.5]))
        rows = [rng.choice(domains)[: rng.randint(0, 7)] for _ in range(rng.randint(1, 6))]
        counts = [rng.choice([0, 1, 2, 5, 30]) for _ in rows]
        sps = rng.choice(tables)
        walk = getattr(sps, "convex", sps)
        cap, fixed = rng.choice([0, 3, 17, 40, 10_000]), rng.choice([0, 5])
        written = [row for row, count in zip(rows, counts) for _ in range(count)]
        want = schedule(written, walk, cap, fixed)
        got = schedule_groups(rows, counts, walk, cap, fixed)
        assert [n for lengths in got for n in lengths] == want
        assert [len(lengths) for lengths in got] == counts
        policy, windows = ScheduledLength(), [len(row) for row in rows]
        chosen = policy.choose(VerifyRound([len(row) for row in written], written, cap, sps))
        assert [
            n for lengths in choose_groups(policy, windows, rows, counts, cap, sps) for n in lengths
        ] == chosen
        trimmed = policy.choose(VerifyRound([len(row) for row in written], written, cap, None))
        assert [
            n for lengths in choose_groups(policy, windows, rows, counts, cap, None) for n in lengths
        ] == trimmed


def test_pipelined_takes_capacity_from_history_and_ranks_live():
    flat_then_cliff = table({b: 10.0 if b <= 4 else 1.0 for b in range(1, 20)})
    live = [[0.2, 0.1], [0.9, 0.8]]
    policy = ScheduledLength(pipelined=True)
    # Without history it is Algorithm 1 on the live round.
    no_history = VerifyRound([2, 2], live, 4, flat_then_cliff)
    assert policy.choose(no_history) == schedule(live, flat_then_cliff, 4)
    # History worth two tokens: the two most certain live tokens are verified, whatever their value.
    for history in ([[0.9, 0.9], []], [[0.1, 0.1], [0.1, 0.1]]):
        k = best_capacity(history, 2, flat_then_cliff, 4)
        assert k == 2
        assert policy.choose(VerifyRound([2, 2], live, 4, flat_then_cliff, history)) == [0, 2]


def test_requests_without_confidences_keep_their_window():
    flat = table(dict.fromkeys(range(1, 20), 1.0))
    cliff = table({b: 10.0 if b <= 5 else 1.0 for b in range(1, 20)})
    rnd = VerifyRound([3, 2], [None, [0.9, 0.5]], step_cap=10, sps=cliff)
    # Request 0 (no confidence) takes 3 tokens: B starts at 2 + 3 = 5, so one more falls off the cliff.
    assert ScheduledLength().choose(rnd) == [3, 0]
    assert ScheduledLength().choose(VerifyRound([3, 2], [None, [0.9, 0.5]], 10, flat)) == [3, 2]
    # No cost table: every window in full, trimmed to the step cap longest first.
    assert ScheduledLength().choose(VerifyRound([3, 2], [[0.9] * 3, [0.9, 0.5]], 4, None)) == [2, 2]


def test_budget_caps_cut_windows():
    proposals = [
        DraftProposal([1, 2, 3, 4], confidence=torch.tensor([0.9, 0.9, 0.9, 0.9])),
        DraftProposal([5]),
    ]
    rnd = VerifyRound.build(proposals, [2, 3], step_cap=10)
    assert rnd.windows == [2, 1] and rnd.survival == [pytest.approx([0.9, 0.81]), None]
    flat = table(dict.fromkeys(range(1, 20), 1.0))
    assert ScheduledLength().choose(VerifyRound.build(proposals, [2, 3], 10, flat)) == [2, 1]
    assert ScheduledLength().choose(VerifyRound.build(proposals, [4, 3], 2, flat)) == [1, 1]


def test_draft_budget_per_request_and_class():
    budget = DraftBudget(max_step_tokens=8, max_request_tokens=3, max_request_tokens_by_class={"batch": 1})
    assert budget.request_cap(None) == 3 and budget.request_cap("batch") == 1 and budget.request_cap("x") == 3
    assert DraftBudget().request_cap("batch") is None
    assert budget.to_dict() == {
        "max_step_tokens": 8,
        "max_request_tokens": 3,
        "max_request_tokens_by_class": {"batch": 1},
        "max_step_s": None,
    }
    for bad in (
        dict(max_step_tokens=-1),
        dict(max_request_tokens=1.5),
        dict(max_request_tokens_by_class={"a": -2}),
    ):
        with pytest.raises(InvalidRequestError):
            DraftBudget(**bad)


def test_threshold_and_fixed_modes():
    rows = [survival([0.9, 0.9, 0.5]), survival([0.4, 1.0]), None]
    rnd = VerifyRound([3, 2, 2], rows, step_cap=10)
    assert ConfidenceThreshold(0.5).choose(rnd) == [2, 0, 2]  # 0.9, 0.81 | 0.4 below | no confidence
    assert ConfidenceThreshold(0.5).choose(VerifyRound([3, 2, 2], rows, step_cap=3)) == [1, 0, 2]
    assert FixedLength().choose(rnd) == [3, 2, 2]
    assert FixedLength().choose(VerifyRound([3, 2, 2], rows, step_cap=4)) == [1, 1, 2]


def test_every_mode_builds():
    assert [window_limit(m, 5) for m in SCHEDULERS] == [5, 5, 5, 5, 1, 0]
    kinds = {m: type(make_policy(m, 0.3)).__name__ for m in SCHEDULERS}
    assert kinds == {
        "dspark": "ScheduledLength",
        "pipelined": "ScheduledLength",
        "fixed": "FixedLength",
        "threshold": "ConfidenceThreshold",
        "mtp1": "FixedLength",
        "plain": "FixedLength",
    }
    with pytest.raises(InvalidRequestError):
        EngineConfig(model="m", scheduler="greedy-search")
    with pytest.raises(InvalidRequestError):
        EngineConfig(model="m", confidence_threshold=1.5)
