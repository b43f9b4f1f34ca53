"""The paper's Appendix A: a scheduler that looks past a drop biases the output; the early stop and
the two-rounds-old pipelined capacity do not.

The situation: the confidence of slot k is a function of the token drawn at slot k-1 (the anchor for
slot 1), as DSpark's head reads W1[x_{k-1}]. With SPS = 1, 0.6, 0.55 for B = 1, 2, 3 and one request,
verifying slot 1 alone does not pay when c_1 = 0.5 (1.5 * 0.6 < 1), but slots 1 and 2 do when
c_2 = 1 (2 * 0.55 > 1) and do not when c_2 = 0.1. A search for the best prefix therefore verifies
slot 1 exactly when x_1 is a token after which the drafter is confident: a decision about slot 1 that
reads x_1 itself. Algorithm 1 stops at the first drop, so slot 1 is decided on c_1 alone, and slot 2
(when c_1 = 0.9 makes slot 1 pay) on c_2, a function of x_1 only. That is allowed, and the tests
show it: the choice depends on the sampled tokens, yet the output distribution is the target's. (The
engine's walk reads the table's convex envelope, SPS 1, 0.71, 0.55, dspark/scheduler.py: there slot 1
pays after either anchor, 1.5 * 0.71 > 1, and slot 2 is verified exactly when x_1 = A.)

First exactly, by enumerating a two-token vocabulary (the paper's 0.7/0.3 turning into 0.85/0.15),
then statistically through the whole engine against a real target's exact marginals.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict

import pytest
import torch
from lossless_check import (
    POSITIONS,
    VOCAB,
    build_small_vocab_target,
    exact_marginals,
    p_values,
    sample_counts,
)
from test_drafters import AdversarialDrafter

from dspark import SamplingParams
from dspark.config import EngineConfig
from dspark.cost_table import CostTable
from dspark.engine import Engine
from dspark.scheduler import RoundRate, best_capacity, pick_top, survival
from dspark.verify_policy import ScheduledLength, VerifyRound

RATES = [1.0, 0.6, 0.55]  # SPS(1), SPS(2), SPS(3)


class LookPastDropSearch:
    """The biased search: the best prefix of the live ranking, found without the stop."""

    def choose(self, round_: VerifyRound) -> list[int]:
        rows = [row or [] for row in round_.survival]
        return pick_top(rows, best_capacity(rows, len(rows), round_.sps, round_.step_cap))


# ---- exact: one request, tokens A=0 and B=1, target p and draft q the same at every position ----------

P, Q, GAMMA = (0.7, 0.3), (0.5, 0.5), 2


def paper_confidence(slot: int, previous: int) -> float:
    if slot == 1:
        return 0.9 if previous == 0 else 0.5
    return 1.0 if previous == 0 else 0.1


def emitted(
    policy, anchor: int, n: int, history=None, seen: set | None = None, drafting_s: float | None = None
) -> dict[tuple, float]:
    """Exact distribution of the next n tokens one request emits, running rounds until n are out.
    `drafting_s`: the walk weighs whole rounds, that many seconds of drafting added to each forward."""
    if n == 0:
        return {(): 1.0}
    sps = CostTable([1, 2, 3], RATES, 3)
    if drafting_s is not None:
        sps = RoundRate(sps, drafting_s)
    out: dict[tuple, float] = defaultdict(float)
    for draft in itertools.product(range(2), repeat=GAMMA):
        mass = Q[draft[0]] * Q[draft[1]]
        conf = [paper_confidence(k, prev) for k, prev in enumerate([anchor, *draft[:-1]], start=1)]
        length = policy.choose(VerifyRound([GAMMA], [survival(conf)], GAMMA, sps, history))[0]
        if seen is not None:
            seen.add((anchor, draft[0], length))
        for tokens, prob in _verify_branches(draft[:length]):
            rest = emitted(policy, tokens[-1], max(0, n - len(tokens)), history, seen, drafting_s)
            for tail, p_tail in rest.items():
                out[(tokens + tail)[:n]] += mass * prob * p_tail
    return out


def _verify_branches(draft: tuple) -> list[tuple[tuple, float]]:
    """Rejection sampling of `draft` against P with proposal Q: (emitted tokens, probability) pairs."""
    residual = [max(0.0, p - q) for p, q in zip(P, Q)]
    residual = [r / sum(residual) for r in residual]
    branches, reach = [], 1.0
    for k, x in enumerate(draft):
        accept = min(1.0, P[x] / Q[x])
        branches += [(draft[:k] + (t,), reach * (1 - accept) * residual[t]) for t in range(2)]
        reach *= accept
    branches += [(draft + (t,), reach * P[t]) for t in range(2)]
    return [(tokens, prob) for tokens, prob in branches if prob > 0]


def target(n: int) -> dict[tuple, float]:
    return {seq: math.prod(P[t] for t in seq) for seq in itertools.product(range(2), repeat=n)}


def test_appendix_a_look_past_search_is_biased_exactly():
    first = emitted(LookPastDropSearch(), anchor=1, n=1)  # anchor B: c_1 = 0.5
    assert first[(0,)] == pytest.approx(0.85) and first[(1,)] == pytest.approx(0.15)


@pytest.mark.parametrize("anchor", [0, 1])
def test_algorithm1_is_lossless_exactly_while_reading_sampled_tokens(anchor):
    seen: set = set()
    assert emitted(ScheduledLength(), anchor, n=3, seen=seen) == pytest.approx(target(3), abs=1e-12)
    # After either anchor (later rounds start from both) slot 1 pays on the envelope and slot 2 is
    # verified exactly when x_1 = A: the length read a sampled token.
    assert seen == {(0, 0, 2), (0, 1, 1), (1, 0, 2), (1, 1, 1)}


@pytest.mark.parametrize("anchor", [0, 1])
def test_algorithm1_on_whole_rounds_is_lossless_exactly(anchor):
    """With the drafting's cost in each round (RoundRate) the walk still stops at its first drop on a
    convex step time, reading sampled tokens as before: exactly lossless."""
    seen: set = set()
    assert emitted(ScheduledLength(), anchor, n=3, seen=seen, drafting_s=2.0) == pytest.approx(
        target(3), abs=1e-12
    )
    assert {length for _, _, length in seen} == {1, 2}  # the length still reads x_1


@pytest.mark.parametrize("history, capacity", [([[0.1, 0.1]], 0), ([[0.9, 0.05]], 1), ([[1.0, 1.0]], 2)])
def test_pipelined_is_lossless_exactly(history, capacity):
    policy = ScheduledLength(pipelined=True)
    seen: set = set()
    assert emitted(policy, 1, n=3, history=history, seen=seen) == pytest.approx(target(3), abs=1e-12)
    assert {length for _, _, length in seen} == {capacity}  # K came from history, whatever was drawn


def test_look_past_search_with_firewall_removed_is_the_pipelined_variant_on_live_confidences():
    # The biased search is exactly the pipelined variant fed this round instead of round t-2.
    sps = CostTable([1, 2, 3], RATES, 3)
    for draft in itertools.product(range(2), repeat=GAMMA):
        conf = [paper_confidence(k, prev) for k, prev in enumerate([1, *draft[:-1]], start=1)]
        live = [survival(conf)]
        fed_live = ScheduledLength(pipelined=True).choose(VerifyRound([GAMMA], live, GAMMA, sps, live))
        assert fed_live == LookPastDropSearch().choose(VerifyRound([GAMMA], live, GAMMA, sps))


# ---- statistically, through the engine, against the target's exact marginals ------------------------

PARAMS = SamplingParams(temperature=1.0, max_tokens=POSITIONS + 1, ignore_eos=True)  # room for 2 drafts
CONFIDENT_ANCHORS, CONFIDENT_PREVIOUS = {1, 3, 5}, {0, 1, 2, 3}


def engine_confidence(slot: int, previous: int) -> float:
    if slot == 1:
        return 0.9 if previous in CONFIDENT_ANCHORS else 0.5
    return 1.0 if previous in CONFIDENT_PREVIOUS else 0.1


@pytest.fixture(scope="module")
def small_target(tmp_path_factory):
    path = tmp_path_factory.mktemp("appendix_a")
    build_small_vocab_target(path)
    return path, exact_marginals(path, PARAMS)


def engine_counts(path, mode: str, max_num_seqs: int, samples: int, policy=None) -> tuple:
    # Past B = 3 the rate keeps falling 3 % a token, so a larger batch also prunes by confidence.
    rates = RATES + [RATES[-1] * 0.97 ** (b - 3) for b in range(4, 65)]
    engine = Engine(
        EngineConfig(
            model=str(path),
            scheduler=mode,
            draft_gate=False,  # the Appendix A situation needs a drafted block every round
            max_num_seqs=max_num_seqs,
            num_speculative_tokens=2,
            num_kv_pages=256,
            kv_page_size=4,
            seed=11,
            cost_table_ema=0.0,  # the table is the test's, exactly
        ),
        drafter=AdversarialDrafter(torch.zeros(VOCAB), gamma=2, confidence=engine_confidence),
        policy=policy,
        cost_table=CostTable(list(range(1, 65)), rates, 64),
    )
    return sample_counts(engine, PARAMS, samples), engine


def test_engine_look_past_search_is_detected(small_target):
    path, expected = small_target
    counts, _ = engine_counts(path, "dspark", 1, 1500, policy=LookPastDropSearch())
    assert min(p_values(counts, expected)[1:]) < 1e-6  # power: the biased search fails


@pytest.mark.parametrize(
    "mode, max_num_seqs, samples", [("dspark", 1, 1500), ("dspark", 16, 3000), ("pipelined", 16, 3000)]
)
def test_engine_scheduler_is_lossless(small_target, mode, max_num_seqs, samples):
    path, expected = small_target
    counts, engine = engine_counts(path, mode, max_num_seqs, samples)
    assert min(p_values(counts, expected)) > 1e-3
    hist = engine.stats.verify_length_hist
    assert len(hist) == 3 and min(hist) > 0  # it verified 0, 1 and 2 drafts, by confidence
