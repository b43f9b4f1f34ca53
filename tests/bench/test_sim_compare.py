"""bench/sim_compare.py: the simulator against two real runs of one trace, judged against their mean and
beside their own spread, and the engines' steps set side by side."""

from __future__ import annotations

import json

import pytest

from bench.sim_compare import (
    METRICS,
    compare,
    machine_factor,
    speed_matched,
    speed_matched_lines,
    split_lines,
    step_view,
    validation_lines,
)


def figures(**given: float) -> dict:
    return {m: given.get(m, 1.0) for m in METRICS}


def test_the_sim_is_judged_against_the_mean_of_the_real_runs_beside_their_own_spread():
    run1 = figures(ttft_p50_s=0.08, tpot_p50_s=0.020, tpot_p99_s=0.030)
    run2 = figures(ttft_p50_s=0.10, tpot_p50_s=0.021, tpot_p99_s=0.030)
    sim = figures(ttft_p50_s=0.085, tpot_p50_s=0.016, tpot_p99_s=0.036)
    alone = figures(ttft_p50_s=0.045)
    out = compare([run1, run2], {"sim": sim, "sim_engine_alone": alone})
    ttft = out["ttft_p50_s"]
    assert ttft["real_runs"] == [0.08, 0.10] and ttft["real"] == 0.09
    assert ttft["real_vs_real"] == 0.25  # run 2 is 25 % above run 1: the real cluster's own noise
    assert ttft["sim"] == 0.085 and ttft["rel_diff"] == -0.0556
    assert ttft["rel_diff_runs"] == [0.0625, -0.15]
    assert ttft["sim_engine_alone"] == 0.045 and ttft["rel_diff_sim_engine_alone"] == -0.5
    tpot = out["tpot_p50_s"]
    assert (tpot["real"], tpot["real_vs_real"], tpot["rel_diff"]) == (0.0205, 0.05, -0.2195)
    assert out["tpot_p99_s"]["rel_diff"] == 0.2 and out["tpot_p99_s"]["real_vs_real"] == 0.0
    assert out["max_abs_rel_diff"] == 0.2195
    assert out["within_15pct"] is False
    assert out["outside_15pct"] == ["tpot_p50_s", "tpot_p99_s"]
    # TTFT's -5.6 % is inside the real runs' own 25 %; the TPOT differences are not.
    assert out["beyond_real_noise"] == ["tpot_p50_s", "tpot_p99_s"]


def test_one_real_run_has_no_spread_and_a_missing_figure_is_not_judged():
    out = compare([figures(tpot_p99_s=None)], {"sim": figures(throughput_rps=1.1)})
    assert out["throughput_rps"]["real_vs_real"] is None
    assert out["throughput_rps"]["rel_diff"] == pytest.approx(0.1)
    assert out["tpot_p99_s"]["real"] is None and out["tpot_p99_s"]["rel_diff"] is None
    assert out["within_15pct"] is True and out["outside_15pct"] == []
    assert out["beyond_real_noise"] == []


def test_a_step_view_reads_the_real_engines_cpu_or_the_models_time_alone():
    real = {
        "steps": 100,
        "step_time_s": 2.0,
        "engine_cpu_s": 1.25,
        "rounds": 150,
        "forward_tokens": 400,
        "drafted_tokens": 30,
        "machine_busy_cores": 1.95,
        "stack_cores": 1.7,
        "engine_cpu_over_model": 1.07,
    }
    real_only = ("engine_cpu_s", "machine_busy_cores", "stack_cores", "engine_cpu_over_model")
    sim = {k: v for k, v in real.items() if k not in real_only}
    sim["alone_time_s"] = 1.6
    assert step_view(real) == {
        "steps": 100,
        "step_ms": 20.0,
        "cpu_ms": 12.5,
        "stretch": 1.6,
        "rounds_per_step": 1.5,
        "tokens_per_step": 4.0,
        "keys_per_step": None,  # not counted (an engine before the attention_keys counter)
        "drafted_per_round": 0.2,
        "cpu_over_model": 1.07,
        "other_cores": 0.25,
    }
    assert (step_view(sim)["cpu_ms"], step_view(sim)["stretch"]) == (16.0, 1.25)
    assert step_view(sim)["other_cores"] is None and step_view(sim)["cpu_over_model"] is None
    assert step_view({**real, "attention_keys": 52_345})["keys_per_step"] == 523.5


def split(path: float, queue: float, prefill: float) -> dict:
    """A ttft_split of 300 requests whose p50 is the mean and p99 twice it."""
    parts = {"path_s": path, "queue_s": queue, "prefill_s": prefill}
    return {"requests": 300} | {k: {"mean": v, "p50": v, "p99": 2 * v} for k, v in parts.items()}


def test_a_result_without_the_real_runs_timing_says_so():
    lines = split_lines({"ttft_split": {"real_runs": [], "sim": split(0.03, 0.004, 0.035)}})
    assert "| sim | 300 | 30.0 / 30.0 / 60.0 | 4.0 / 4.0 / 8.0 | 35.0 / 35.0 / 70.0 | - / - / - |" in lines
    assert any("No per-request timing from the real runs" in line for line in lines)
    assert split_lines({}) == []


def test_the_report_shows_both_real_runs_their_spread_the_sim_and_the_steps():
    run1 = figures(tpot_p50_s=0.020)
    run2 = figures(tpot_p50_s=0.025)
    validation = compare([run1, run2], {"sim": figures(tpot_p50_s=0.0225)})
    steps = {"steps": 10, "step_time_s": 0.2, "rounds": 10, "forward_tokens": 20, "drafted_tokens": 0}
    busy = {"machine_busy_cores": 1.5, "stack_cores": 1.5}
    shared = {"machine_busy_cores": 1.9, "stack_cores": 1.6}
    validation |= {
        "command": "python bench/sim_validate.py --models models --measure-profile",
        "real_measured": "python bench/sim_validate.py --models models --measure-profile",
        "profile": {
            "path": "sim/profiles/cpu_measured.json",
            "host_check": {
                "engine_c2_p48": {
                    "measured": 1.6,
                    "model": 1.5,
                    "model_with_other_work": 1.55,
                    "engines_stepping": 0.9,
                },
                "engine_c8_p48": {
                    "measured": 1.7,
                    "model": 1.6,
                    "model_with_other_work": 1.7,
                    "engines_stepping": 0.99,
                    "path_ms": 40.0,
                    "path_model_ms": 36.5,
                    "path_at_measured_stretch_ms": 38.2,
                    "path_idle_ms": 22.0,
                    "path_in_ms": 30.0,
                    "path_in_model_ms": 27.5,
                    "path_in_idle_ms": 16.0,
                },
            },
        },
        "real_engine_steps": [
            {**steps, **busy, "engine_cpu_s": 0.1, "engine_cpu_over_model": 1.1},
            {**steps, **shared, "engine_cpu_s": 0.125},
        ],
        "sim_engine_steps": {**steps, "alone_time_s": 0.16, "engine_cpu_over_model": 1.04},
        "ttft_split": {
            "real_runs": [
                split(0.030, 0.004, 0.035),
                split(0.032, 0.005, 0.036) | {"inbound_s": {"mean": 0.012, "p50": 0.011, "p99": 0.03}},
            ],
            "sim": split(0.029, 0.0045, 0.0355),
        },
        "timeline": [
            {"part": "real run 1", "started": "2026-11-30T10:00:00Z", "minutes": 2.6},
            {"part": "profile measurement", "started": "2026-11-30T10:02:36Z", "minutes": 1.7},
        ],
    }
    lines = validation_lines(validation)
    assert "profile: `sim/profiles/cpu_measured.json`" in lines[0]
    assert lines[1].startswith(
        "| metric | real run 1 | real run 2 | run 2 vs run 1 | sim | sim vs real (mean)"
    )
    assert "| tpot_p50_s | 0.02 | 0.025 | +25.0% | 0.0225 | +0.0% | +12.5% | -10.0% |" in lines
    assert "| throughput_rps | 1.0 | 1.0 | +0.0% | 1.0 | +0.0% | +0.0% | +0.0% |" in lines
    assert "\nall within 15 %; sim parts from the real mean by more than the real runs part: none\n" in lines
    assert (
        "Host model on the profile measurement's engine runs, stretch measured / modelled (modelled with "
        "the other work on the machine; the share of the run each engine stepped): "
        "engine_c2_p48 1.6 / 1.5 (1.55; 0.9); engine_c8_p48 1.7 / 1.6 (1.7; 0.99)\n"
    ) in lines
    assert (
        "Serving path on the same runs, mean ms measured / modelled (modelled at the run's measured step "
        "stretch; 22.0 ms at idle): engine_c8_p48 40.0 / 36.5 (38.2), way in 30.0 / 27.5\n"
    ) in lines
    header = (
        "|  | requests | serving path mean / p50 / p99 | engine queue mean / p50 / p99 | "
        "prefill mean / p50 / p99 | path in |"
    )
    assert header in lines
    row = "| real run 2 | 300 | 32.0 / 32.0 / 64.0 | 5.0 / 5.0 / 10.0 | 36.0 / 36.0 / 72.0 | "
    row += "12.0 / 11.0 / 30.0 |"
    assert row in lines
    assert "| sim | 300 | 29.0 / 29.0 / 58.0 | 4.5 / 4.5 / 9.0 | 35.5 / 35.5 / 71.0 | - / - / - |" in lines
    assert (
        "Sitting: real run 1 2026-11-30T10:00:00Z (2.6 min); "
        "profile measurement 2026-11-30T10:02:36Z (1.7 min)\n"
    ) in lines
    assert "| real run 1 | 10 | 20.0 | 10.0 | 2.0 | 1.0 | 2.0 | - | 0.0 | 1.1 | 0.0 |" in lines
    assert "| real run 2 | 10 | 20.0 | 12.5 | 1.6 | 1.0 | 2.0 | - | 0.0 | - | 0.3 |" in lines
    assert "| sim | 10 | 20.0 | 16.0 | 1.25 | 1.0 | 2.0 | - | 0.0 | 1.04 | - |" in lines
    (note,) = [line for line in lines if line.startswith("\nOther work")]
    assert "(real run 2 0.3)" in note


def test_more_real_runs_give_the_spread_of_all_of_them():
    """Four real runs: the reference is their mean, the noise their largest over their smallest, and the
    report's column says so (with two, it stays run 2 against run 1)."""
    runs = [figures(tpot_p50_s=v) for v in (0.020, 0.016, 0.018, 0.022)]
    out = compare(runs, {"sim": figures(tpot_p50_s=0.0165)})
    tpot = out["tpot_p50_s"]
    assert tpot["real"] == 0.019 and tpot["real_spread"] == 0.375 and tpot["real_vs_real"] == -0.2
    assert tpot["rel_diff"] == -0.1316 and out["beyond_real_noise"] == []
    out = compare(runs, {"sim": figures(tpot_p50_s=0.011)})
    assert out["beyond_real_noise"] == ["tpot_p50_s"]  # -42 %: beyond the runs' 37.5 %
    validation = {**out, "real_measured": "r", "command": "c"}
    lines = validation_lines(validation)
    assert lines[1].startswith("| metric | real run 1 | real run 2 | real run 3 | real run 4 | runs' spread")
    assert "| tpot_p50_s | 0.02 | 0.016 | 0.018 | 0.022 | +37.5% | 0.011 | -42.1% |" in " ".join(lines)


def test_the_simulator_under_several_seeds_is_judged_by_their_mean_beside_their_spread():
    """Three seeds of the model as it stands: "sim" is their mean (the variants stay as given), each
    metric keeps the seeds' figures and their spread, and the report says how many seeds and how far
    apart they fell; one seed leaves the comparison as it was."""
    runs = [figures(tpot_p99_s=0.020), figures(tpot_p99_s=0.022)]
    seeded = [figures(tpot_p99_s=v) for v in (0.013, 0.015, 0.014)]
    alone = figures(tpot_p99_s=0.010)
    out = compare(runs, {"sim": seeded[0], "sim_engine_alone": alone}, seeded)
    tpot = out["tpot_p99_s"]
    assert tpot["sim"] == 0.014 and tpot["sim_runs"] == [0.013, 0.015, 0.014]
    assert tpot["sim_spread"] == pytest.approx(0.1538, abs=1e-4) and tpot["rel_diff"] == round(
        0.014 / 0.021 - 1, 4
    )
    assert tpot["sim_engine_alone"] == 0.010
    lines = validation_lines({**out, "sim_seeds": 3, "real_measured": "r", "command": "c"})
    assert any(
        line.startswith("\nsim: the mean of 3 runs under their own seeds") and "+15.4%" in line
        for line in lines
    )
    single = compare(runs, {"sim": seeded[0]}, seeded[:1])
    assert single["tpot_p99_s"]["sim"] == 0.013 and "sim_runs" not in single["tpot_p99_s"]


def test_a_runs_machine_factor_is_its_stacks_cpu_over_the_profiles_model_of_the_same_work():
    counters = {
        "engine_cpu_s": 66.0,  # the engines' threads
        "engine_model_s": 60.0,  # the profile's model of the same steps
        "serving_load_cores": 0.5,  # the serving path's busy cores over the run
        "serving_load_model_cores": 0.4,  # the profile's host block at the run's rates
        "wall_s": 100.0,
    }
    # The simulator reads its own engines at 1.1 of the model (the model prices the mean step): the
    # run's engines at 66 / 1.1 = 60 are as fast as the profile; the path is 1.25x slower.
    factor = machine_factor(counters, 1.1)
    assert factor == {"stack": round((60 + 50) / (60 + 40), 4), "engine": 1.0, "path": 1.25}
    assert machine_factor({**counters, "serving_load_cores": None}, 1.1) is None
    assert machine_factor(counters, None) is None


def test_speed_matched_sets_each_real_run_beside_the_sim_at_its_factor_and_judges_the_means():
    reals = [figures(ttft_p99_s=0.050, tpot_p99_s=0.010), figures(ttft_p99_s=0.070, tpot_p99_s=0.020)]
    sims = [figures(ttft_p99_s=0.055, tpot_p99_s=0.011), figures(ttft_p99_s=0.065, tpot_p99_s=0.014)]
    factors = [{"stack": 0.9, "engine": 0.88, "path": 0.95}, {"stack": 1.4, "engine": 1.4, "path": 1.3}]
    out = speed_matched(reals, sims, factors)
    ttft = out["ttft_p99_s"]
    assert ttft["rel_diff_runs"] == [0.1, -0.0714]
    assert (ttft["real"], ttft["sim"], ttft["rel_diff"]) == (0.06, 0.06, 0.0)
    tpot = out["tpot_p99_s"]
    assert tpot["rel_diff_runs"] == [0.1, -0.3] and tpot["rel_diff"] == -0.1667
    assert out["outside_15pct"] == ["tpot_p99_s"] and out["within_15pct"] is False
    assert out["runs_outside_15pct"]["tpot_p99_s"] == [2] and out["runs_outside_15pct"]["ttft_p99_s"] == []
    lines = speed_matched_lines(out)
    assert "run 2 (x1.400): real / sim" in lines[1]
    assert "0.88 / 0.95" not in lines[0] and "0.880 / 0.950" in lines[0]
    row = next(line for line in lines if line.startswith("| tpot_p99_s"))
    assert "0.02 / 0.014 (-30.0%)" in row and row.endswith("| -16.7% |")
    assert lines[-1].strip() == "outside 15 %: tpot_p99_s; single runs outside 15 %: tpot_p99_s (run 2)"
    assert speed_matched_lines(None) == []


def test_the_validation_keeps_each_real_request_as_the_open_loop_runs_keep_theirs():
    from bench.serving_cost import ARRIVAL_COLUMNS
    from bench.sim_validate import REQUEST_COLUMNS, request_rows
    from sim.workload import Request

    assert REQUEST_COLUMNS == (*ARRIVAL_COLUMNS, "generated")  # bench/sim_arrivals.py reads both alike
    done = Request(0, 1.0, 8, 5, "standard", "code", replica="SERVE_REPLICA::b", first_token=1.05)
    done.finish, done.generated, done.outcome = 1.09, 5, "done"
    done.admitted, done.scheduled = 1.02, 1.03
    other = Request(1, 2.0, 8, 5, "standard", "code", replica="SERVE_REPLICA::a", first_token=2.04)
    other.finish, other.generated = 2.2, 5  # no replica timing: no queue or prefill
    again = Request(2, 3.0, 8, 5, "standard", "code", replica="SERVE_REPLICA::b")  # never answered
    run = request_rows([done, other, again], [0.012, None, None])
    assert run["columns"] == list(REQUEST_COLUMNS)
    assert run["requests"][0] == [1.0, 1.05, 1.09, 0.012, 0.01, 0.02, 0, 5]
    assert run["requests"][1] == [2.0, 2.04, 2.2, None, None, None, 1, 5]  # replicas numbered as they come
    assert run["requests"][2] == [3.0, None, None, None, None, None, 0, 0]


def test_the_report_says_request_by_request_how_the_real_tpot_stands_to_the_simulated():
    from bench.sim_compare import paired_lines

    p = {
        "tpot_real_over_sim": [0.9, 1.02, 1.3],
        "tpot_correlation": 0.7,
        "ratio_vs_decoding_beside_sim": 0.1,
        "ratio_vs_decoding_beside_real": 0.2,
        "on_own_replica": {"real": {"share_on_own": 0.72}},
    }
    lines = paired_lines([p, {}])
    assert lines[1] == (
        "- run 1: 0.9 / 1.02 / 1.3 (correlation 0.7; the ratio's correlation with the requests decoding "
        "beside each, simulated 0.1, real 0.2; share of that company on its own replica, real 0.72)"
    )
    assert len(lines) == 3 and paired_lines(None) == []


def test_the_real_requests_file_holds_a_request_to_a_line_and_reads_back_as_written():
    from bench.sim_validate import requests_json

    runs = [
        {"columns": ["sent_s", "generated"], "requests": [[0.5, 12], [1.25, None]]},
        {"columns": ["sent_s", "generated"], "requests": [[0.75, 3]]},
    ]
    text = requests_json(runs)
    assert json.loads(text) == runs
    assert "[1.25, null]" in text.splitlines()  # one request per line
