"""bench/accept_spread.py's statistics: the spread of per-request acceptance against a permutation null,
and the rounds' lag-1 correlation."""

from __future__ import annotations

import random

import pytest

from bench.accept_spread import lag_correlation, permutation_spread, rate_spread, summarize


def requests_of(rates: list[float], rounds: int, seed: int) -> list[list[tuple[int, int]]]:
    """Requests of `rounds` rounds each verifying 4 drafts, each accepted with the request's rate."""
    rng = random.Random(seed)
    return [[(4, sum(rng.random() < p for _ in range(4))) for _ in range(rounds)] for p in rates]


def test_requests_sharing_one_rate_spread_as_their_shuffled_rounds_do():
    alike = requests_of([0.5] * 40, 30, seed=1)
    figures = summarize(alike)
    assert figures["rate_sd_null_p50"] * 0.7 < figures["rate_sd"] < figures["rate_sd_null_p95"]
    assert figures["accept_rate"] == pytest.approx(0.5, abs=0.03)
    assert abs(figures["lag1_correlation"]) < 0.1


def test_requests_of_two_kinds_spread_beyond_the_null():
    mixed = requests_of([0.3] * 20 + [0.7] * 20, 30, seed=2)
    figures = summarize(mixed)
    assert figures["rate_sd"] > 2 * figures["rate_sd_null_p95"]
    assert figures["rate_min"] < 0.45 < 0.55 < figures["rate_max"]


def test_the_null_keeps_each_requests_round_count_and_the_pool():
    requests = [[(4, 1)] * 3, [(2, 2)] * 5, [(3, 0)]]
    # Dealing the same rounds again: the overall rate cannot change, only who has which round.
    null = permutation_spread(requests, draws=50)
    assert null == sorted(null) and len(null) == 50
    assert rate_spread([[(4, 4)], [(4, 0)]]) == pytest.approx(0.5)
    assert rate_spread([[(0, 0)], [(4, 2)]]) == 0.0  # a request that verified nothing has no rate


def test_a_round_that_predicts_the_next_shows_in_the_lag_correlation():
    streaky = [[(4, a) for a in ([4] * 5 + [0] * 5) * 3]]
    assert lag_correlation(streaky) > 0.5
    assert lag_correlation([[(4, 1)] * 5]) is None  # no variation: no correlation to speak of
