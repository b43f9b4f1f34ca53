"""drafter_service/demo/quality.py: what counts as a short loop, and the share's interval; and
bench/demo_quality.py run on the tiny target, writing the results it promises."""

from __future__ import annotations

import json

import pytest

from bench.demo_quality import main
from drafter_service.demo.quality import LONG_LOOP_TAIL, LONG_MAX_PERIOD, loop_period, wilson_interval


def test_a_tail_that_repeats_with_a_short_period_is_a_loop():
    assert loop_period([5] * 40) == 1  # a run of one token (newlines)
    assert loop_period([9, 9, 9] + [1, 2] * 20) == 2
    assert loop_period(list(range(10)) + [3, 4, 5, 6, 7, 8, 1, 2] * 5) == 8
    # The shortest period is the one reported, though its multiples repeat too.
    assert loop_period([7, 8] * 30) == 2


def test_text_that_does_not_cycle_at_the_end_is_not_a_loop():
    assert loop_period(list(range(100))) is None
    assert loop_period([1, 2] * 30 + [3]) is None  # the last token breaks the cycle
    assert loop_period([1, 2, 3, 4, 5, 6, 7, 8, 9] * 10) is None  # period 9: longer than a short loop
    assert loop_period([4] * 32) is None  # 32 tokens: no earlier cycle to repeat
    assert loop_period([4] * 33) == 1


def test_the_tail_and_period_bounds_are_parameters():
    assert loop_period([1, 2, 3] * 4, tail=6, max_period=3) == 3
    assert loop_period([1, 2, 3] * 4, tail=6, max_period=2) is None


def test_a_sentence_long_loop_is_not_short_but_counts_as_a_loop_up_to_a_sentence():
    sentence = list(range(100, 111))  # 11 tokens: "The class is a list of the file object.\n\n"
    text = list(range(30)) + sentence * 8
    assert loop_period(text) is None
    assert loop_period(text, LONG_LOOP_TAIL, LONG_MAX_PERIOD) == 11
    # A sentence alternating with a variant of itself (one token shorter) is one cycle of 21.
    variants = list(range(30)) + (sentence + sentence[:-1]) * 4
    assert loop_period(variants, LONG_LOOP_TAIL, LONG_MAX_PERIOD) == 21
    assert loop_period(list(range(30)) + list(range(200, 260)), LONG_LOOP_TAIL, LONG_MAX_PERIOD) is None


def test_wilson_interval():
    assert wilson_interval(0, 0) == (0.0, 1.0)
    low, high = wilson_interval(0, 8)
    assert low == 0.0 and high == pytest.approx(0.3244, abs=1e-4)  # not the normal approximation's 0
    low, high = wilson_interval(7, 8)
    assert low == pytest.approx(0.5291, abs=1e-4) and high == pytest.approx(0.9776, abs=1e-4)
    low, high = wilson_interval(50, 100)
    assert low == pytest.approx(1 - high) and low == pytest.approx(0.4038, abs=1e-4)


def test_the_bench_writes_shares_with_intervals_for_each_domain_and_temperature(qwen3_dir, tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    (models / "target").symlink_to(qwen3_dir)
    assert (
        main(["--models", str(models), "--prompts", "3", "--new-tokens", "40", "--out", str(tmp_path)]) == 0
    )
    result = json.loads((tmp_path / "demo_quality.json").read_text())
    for domain in ("code", "prose"):
        for t in ("0.0", "1.0"):
            row = result["domains"][domain][t]
            assert row["continuations"] == 3 and 0 <= row["looping"] <= 3
            low, high = row["loop_share_95"]
            assert low <= row["loop_share"] <= high
            assert sum(row["periods"].values()) == row["looping"]
            assert 0 <= row["long_looping"] <= 3
            low, high = row["long_loop_share_95"]
            assert low <= row["long_loop_share"] <= high
    assert set(result["summary"]) == {
        "loop_share_code_t0",
        "loop_share_prose_t0",
        "long_loop_share_code_t0",
        "long_loop_share_prose_t0",
    }
    assert "| code | 0.0 |" in (tmp_path / "demo_quality.md").read_text()


def test_a_missing_model_is_said_clearly(tmp_path, capsys):
    assert main(["--models", str(tmp_path / "models")]) == 2
    assert "make models" in capsys.readouterr().err
