"""bench/telemetry.py: its paired statistics on synthetic times, and a smoke run on the tiny target
(real engine, real OTLP export to its receiver process) that writes the results it promises."""

from __future__ import annotations

import json

import pytest

from bench.telemetry import ARMS, main, summarize, verdict


def test_costs_are_paired_by_repeat_and_the_noise_band_is_the_a_a_gap():
    # Repeat 2 is twice as slow for every arm (machine drift): paired ratios cancel it.
    seconds = {
        "off": [1.0, 2.0, 1.0],
        "off_again": [1.01, 1.98, 1.0],
        "default": [1.005, 2.01, 1.005],
        "full": [1.1, 2.2, 1.1],
    }
    summary = summarize(seconds, tokens_per_run=100)
    arms = summary["arms"]
    assert arms["off"]["cost_median"] == 0 and arms["off"]["tok_s_each"] == [100.0, 50.0, 100.0]
    assert arms["default"]["cost_median"] == pytest.approx(1 - 1 / 1.005, abs=1e-4)
    assert arms["full"]["cost_median"] == pytest.approx(1 - 1 / 1.1, abs=1e-4)
    assert summary["noise_band"] == pytest.approx(2 / 1.98 - 1, abs=1e-4)


def test_verdicts():
    assert verdict(0.004, 0.02) == "met (<= 1%)"
    assert verdict(0.015, 0.02).startswith("not resolved")
    assert verdict(0.05, 0.02) == "missed (> 1%)"


def test_quick_run_writes_json_and_table(qwen3_dir, tmp_path, capsys):
    assert main(["--model", str(qwen3_dir), "--quick", "--repeats", "1", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "telemetry.json").read_text())
    assert set(result["summary"]["arms"]) == set(ARMS) and result["outputs_identical"] is True
    assert result["workload"]["drafter"] == "ngram"  # no trained drafter beside the tiny target
    # Every request of the traced arms reached the receiver process as a span (2 warm-up + 2 measured),
    # and step events followed the rates: every step in the full arm, a 5% share (maybe none of a run
    # this short) in the default one.
    received = result["received"]
    assert received["bench-default"]["spans"] == received["bench-full"]["spans"] == 4
    assert received["bench-default"]["step_events"] < received["bench-full"]["step_events"] / 10
    assert "| default | 5% of steps |" in (tmp_path / "telemetry.md").read_text()


def test_a_missing_model_is_said_clearly(tmp_path, capsys):
    assert main(["--model", str(tmp_path / "models" / "target")]) == 2
    assert "make models" in capsys.readouterr().err
