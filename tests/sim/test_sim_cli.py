"""python -m sim writes its results JSON and both plots; bench/sim.py's summary math."""

from __future__ import annotations

import argparse
import json

from bench.sim import goodput_at_sla, settings, summary
from sim.__main__ import main, run_grid
from sim.scenario import Scenario


def test_cli_runs_a_grid_and_writes_json_and_pngs(tmp_path):
    main(
        ["--profile", "cpu_measured", "--replicas", "2", "--router", "pow2,sla", "--scheduler", "engine",
         "--load", "0.5", "--duration", "4", "--warmup", "1", "--drain", "40", "--out", str(tmp_path)]
    )  # fmt: skip
    report = json.loads((tmp_path / "sim.json").read_text())
    assert [(r["scenario"]["router"], r["scenario"]["load"]) for r in report["runs"]] == [
        ("pow2", 0.5),
        ("sla", 0.5),
    ]
    for run in report["runs"]:
        assert run["summary"]["requests"] > 0 and run["summary"]["unfinished"] == 0
    assert (tmp_path / "attainment.png").stat().st_size > 0 and (tmp_path / "budget.png").stat().st_size > 0


def _row(router, scheduler, load, offered, attainment, goodput, replicas=100):
    return {
        "scenario": {"router": router, "scheduler": scheduler, "load": load, "replicas": replicas},
        "offered_rps": offered,
        "summary": {"attainment": attainment, "goodput_rps": goodput},
    }


def test_goodput_at_sla_interpolates_where_attainment_crosses_90_percent():
    rows = [
        _row("sla", "engine", 0.5, 50.0, 1.0, 50.0),
        _row("sla", "engine", 0.8, 80.0, 0.95, 76.0),
        _row("sla", "engine", 1.1, 110.0, 0.85, 93.5),
        _row("pow2", "fixed", 0.5, 50.0, 0.8, 40.0),
    ]
    got = goodput_at_sla(rows, 100)
    assert got["sla+engine"] == 95.0  # halfway from 0.95 at 80 to 0.85 at 110
    assert got["pow2+fixed"] is None  # never reaches 90%
    s = summary(rows + [_row("pow2", "fixed", 0.8, 80.0, 0.5, 40.0)])
    assert s["goodput_ratio_vs_pow2_fixed_at_80pct"] == 1.9 and s["attainment_at_80pct"] == 0.95


def test_parallel_grid_gives_the_serial_results_in_order():
    scenarios = [
        Scenario(profile="cpu_measured", replicas=2, router=router, scheduler="engine", load=0.5,
                 duration_s=3.0, warmup_s=1.0, drain_s=8.0)
        for router in ("sla", "pow2", "round_robin")
    ]  # fmt: skip
    serial = run_grid(scenarios)
    parallel = run_grid(scenarios, workers=2)
    assert [r["scenario"]["router"] for r in parallel] == ["sla", "pow2", "round_robin"]
    for a, b in zip(serial, parallel):
        assert a["summary"] == b["summary"] and a["timeline"] == b["timeline"]
        assert a["summary"]["requests"] > 0


def test_the_reports_settings_say_what_ran_per_fleet():
    def row(replicas, router, scheduler, load, duration, cpu):
        r = _row(router, scheduler, load, 0.0, 1.0, 0.0, replicas)
        r["scenario"].update(duration_s=duration, warmup_s=duration / 4, drain_s=duration / 2)
        return {**r, "cpu_s": cpu}

    rows = [row(100, "pow2", "fixed", load, 40.0, 2.0) for load in (0.8, 0.5)]
    rows += [row(100, "sla", "engine", 0.5, 40.0, 3.0), row(1000, "sla", "engine", 0.8, 20.0, 30.0)]
    args = argparse.Namespace(
        profile="p", workers=2, skip_scale=True, scale_duration=20.0, max_num_batched_tokens=None, quick=False
    )
    got = settings(args, rows)
    assert got["fleets"]["100"] == {
        "arms": ["pow2+fixed", "sla+engine"],
        "loads": [0.5, 0.8],
        "runs": 3,
        "cpu_s": 7.0,
        "duration_s": 40.0,
        "warmup_s": 10.0,
        "drain_s": 20.0,
    }
    assert got["fleets"]["1000"]["arms"] == ["sla+engine"] and got["fleets"]["1000"]["runs"] == 1
    assert got["scale_duration_s"] is None and got["workers"] == 2


def test_the_summary_is_taken_on_the_fleet_that_ran_every_arm_and_repeated_for_the_largest():
    rows = [
        _row("pow2", "fixed", 0.8, 80.0, 0.5, 40.0),
        _row("sla", "engine", 0.8, 80.0, 0.9, 72.0),
        _row("sla", "controller", 0.8, 80.0, 0.95, 76.0),
        _row("pow2", "fixed", 0.8, 800.0, 0.6, 480.0, replicas=1000),
        _row("sla", "controller", 0.8, 800.0, 0.99, 792.0, replicas=1000),
    ]
    s = summary(rows)
    assert (s["replicas"], s["goodput_ratio_vs_pow2_fixed_at_80pct"], s["attainment_at_80pct"]) == (
        100,
        1.9,
        0.95,
    )
    big = s["largest_fleet"]
    assert (big["replicas"], big["goodput_ratio_vs_pow2_fixed_at_80pct"], big["attainment_at_80pct"]) == (
        1000,
        1.65,
        0.99,
    )
