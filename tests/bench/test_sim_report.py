"""bench/sim.py's report: the validation against the real cluster as a table, real and simulated."""

import json

import pytest

from bench.sim import markdown
from bench.sim_compare import METRICS as VALIDATED
from bench.sim_compare import validation_lines


def _metric(real: float, sim: float) -> dict:
    return {"real": real, "sim": sim, "rel_diff": round(sim / real - 1, 4)}


def test_the_validation_is_a_table_of_every_metric_real_against_sim():
    validation = {name: _metric(2.0, 2.0) for name in VALIDATED}
    validation["tpot_p99_s"] = _metric(0.04, 0.03)
    validation |= {
        "real_measured": "python bench/sim_validate.py --models models",
        "command": "python bench/sim_validate.py --models models --sim-only",
        "within_15pct": False,
        "outside_15pct": ["tpot_p99_s"],
    }
    lines = validation_lines(validation)
    rows = [line for line in lines if line.startswith("| ") and not line.startswith("| metric")]
    assert [row.split(" | ")[0].strip("| ") for row in rows] == list(VALIDATED)
    assert "| tpot_p99_s | 0.04 | 0.03 | -25.0% |" in lines
    assert "| throughput_rps | 2.0 | 2.0 | +0.0% |" in lines
    assert lines[-1] == "\noutside 15 %: tpot_p99_s\n"
    assert "real half: `python bench/sim_validate.py --models models`" in lines[0]


def test_a_skipped_validation_says_so():
    assert validation_lines({"skipped": "--skip-validation"}) == [
        'Validation: `{"skipped": "--skip-validation"}`\n'
    ]


def test_each_arm_shows_its_attainment_by_half_of_the_scored_window():
    def arm(router: str, halves: list | None) -> dict:
        summary = {"attainment": 0.5, "goodput_rps": 10.0, "ttft_p99_s": 1.0, "tpot_p99_s": 0.03}
        if halves is not None:
            summary["attainment_halves"] = halves
        scenario = {"replicas": 100, "router": router, "scheduler": "fixed", "load": 0.8}
        work = {"accepted_per_round": 2.1, "accepted_share": 0.30435} if router == "sla" else {}
        return {"scenario": scenario, "summary": summary, "verify_per_round": 6.9, **work}

    report = {
        "command": "python bench/sim.py",
        "wall_minutes": 1.0,
        "arms": [arm("pow2", [0.9, 0.1]), arm("sla", [1.0, None]), arm("round_robin", None)],
        "summary": {},
        "scale": {},
        "validation": {"skipped": "--skip-validation"},
    }
    rows = [line for line in markdown(report).splitlines() if line.startswith("| 100 ")]
    assert rows == [
        "| 100 | pow2 | fixed | 0.80 | 0.500 | 0.900 / 0.100 | 10.00 | 1.0 | 0.03 | 6.90 | - | - |",
        "| 100 | sla | fixed | 0.80 | 0.500 | 1.000 / - | 10.00 | 1.0 | 0.03 | 6.90 | 2.10 | 0.304 |",
        "| 100 | round_robin | fixed | 0.80 | 0.500 | - / - | 10.00 | 1.0 | 0.03 | 6.90 | - | - |",
    ]


def test_arms_carried_from_an_earlier_report_are_not_simulated_again(tmp_path, monkeypatch):
    """--arms-from: the arms are deterministic, so a rerun of what needs an idle machine (the scale
    section) takes them as they are and says where they came from."""
    from bench.sim import main

    first, second = tmp_path / "first", tmp_path / "second"
    main(["--quick", "--skip-validation", "--skip-scale", "--workers", "1", "--out", str(first)])
    earlier = json.loads((first / "sim.json").read_text())
    monkeypatch.setattr("bench.sim.arms", lambda args: pytest.fail("the arms were simulated again"))
    main(["--arms-from", str(first / "sim.json"), "--skip-validation", "--skip-scale", "--out", str(second)])
    report = json.loads((second / "sim.json").read_text())
    assert report["arms"] == earlier["arms"] and report["summary"] == earlier["summary"]
    assert report["arms_carried_from"] == earlier["command"]
    assert f"carried from `{earlier['command']}`" in (second / "sim.md").read_text()
    # Carried again, they still name the run that simulated them, not the one that carried them.
    third = tmp_path / "third"
    main(["--arms-from", str(second / "sim.json"), "--skip-validation", "--skip-scale", "--out", str(third)])
    assert json.loads((third / "sim.json").read_text())["arms_carried_from"] == earlier["command"]


def test_a_fleet_simulated_again_replaces_only_its_own_arms(tmp_path):
    """--rerun-fleets: with --arms-from, the arms at the named fleet sizes run again with this command's
    settings (a longer trace at the largest fleet), the others are carried as they were, and the report
    names the command behind each fleet's arms."""
    from bench.sim import main

    first, second = tmp_path / "first", tmp_path / "second"
    small = ["--replicas", "2,4", "--loads", "0.8", "--duration", "3", "--skip-validation", "--skip-scale"]
    main([*small, "--duration-1000", "2", "--workers", "1", "--out", str(first)])
    earlier = json.loads((first / "sim.json").read_text())
    again = [*small, "--duration-1000", "4", "--arms-from", str(first / "sim.json"), "--rerun-fleets", "4"]
    main([*again, "--workers", "1", "--out", str(second)])
    report = json.loads((second / "sim.json").read_text())

    def at(arms: list[dict], n: int) -> list[dict]:
        return [r for r in arms if r["scenario"]["replicas"] == n]

    assert at(report["arms"], 2) == at(earlier["arms"], 2) and at(report["arms"], 2)
    assert {r["scenario"]["duration_s"] for r in at(earlier["arms"], 4)} == {2.0}
    assert {r["scenario"]["duration_s"] for r in at(report["arms"], 4)} == {4.0}
    assert len(at(report["arms"], 4)) == len(at(earlier["arms"], 4)) == 3  # the key arms
    assert report["arms_simulated_by"] == {"2": earlier["command"], "4": report["command"]}
    assert "arms_carried_from" not in report
    text = (second / "sim.md").read_text()
    assert f"The arms at 2 replicas were simulated by `{earlier['command']}`." in text
    # Carried on again, each fleet keeps the command that simulated it.
    third = tmp_path / "third"
    main([*small, "--arms-from", str(second / "sim.json"), "--workers", "1", "--out", str(third)])
    assert json.loads((third / "sim.json").read_text())["arms_simulated_by"] == report["arms_simulated_by"]


def test_the_summary_sets_each_arms_speculation_beside_its_goodput():
    """A goodput ratio is credited only with the drafts each arm verified and the target accepted."""
    from bench.sim import summary

    def arm(router: str, scheduler: str, goodput: float, verify: float, accepted: float) -> dict:
        return {
            "scenario": {"replicas": 100, "router": router, "scheduler": scheduler, "load": 0.8},
            "offered_rps": 100.0,
            "summary": {"attainment": 0.95, "goodput_rps": goodput},
            "verify_per_round": verify,
            "accepted_per_round": accepted,
            "accepted_share": round(accepted / verify, 4),
        }

    out = summary([arm("pow2", "fixed", 40.0, 6.89, 2.3), arm("sla", "controller", 100.0, 4.44, 2.1)])
    assert out["goodput_ratio_vs_pow2_fixed_at_80pct"] == 2.5
    assert out["work_at_80pct"] == {
        "sla+controller": {"verify_per_round": 4.44, "accepted_per_round": 2.1, "accepted_share": 0.473},
        "pow2+fixed": {"verify_per_round": 6.89, "accepted_per_round": 2.3, "accepted_share": 0.3338},
    }


def test_a_scale_section_carried_on_names_the_run_that_measured_it(tmp_path):
    """--scale-from: the scale section's timings come from the run that measured them, however many
    reports carried it since."""
    import argparse

    from bench.sim import scale_section

    measured = {"command": "python bench/sim.py", "scale": {"wall_s": 300.0}}
    first = tmp_path / "first.json"
    first.write_text(json.dumps(measured))
    carried = scale_section(argparse.Namespace(scale_from=first, skip_scale=False))
    assert carried == {"wall_s": 300.0, "carried_from": "python bench/sim.py"}
    second = tmp_path / "second.json"
    second.write_text(
        json.dumps({"command": "python bench/sim.py --scale-from first.json", "scale": carried})
    )
    assert scale_section(argparse.Namespace(scale_from=second, skip_scale=False))["carried_from"] == (
        "python bench/sim.py"
    )


def test_the_scale_section_gives_the_routers_own_share_of_the_trace(monkeypatch):
    """The 1,000-replica trace's CPU, and the part of it the router's decisions took: the decisions of
    the loaded half (the later half of them), extrapolated to ten minutes as the whole is."""
    import argparse

    import bench.sim
    import sim.scenario

    kept = {}
    real_run = sim.scenario.run

    def run(scenario, tick=None):
        result = real_run(scenario, tick)
        kept["cluster"] = result["cluster"]  # scale() takes it out of the result
        return result

    monkeypatch.setattr(bench.sim, "run", run)
    args = argparse.Namespace(profile="gpu_dsv4flash_rocm", scale_duration=0.2, max_num_batched_tokens=None)
    scale = bench.sim.scale(args)
    times = kept["cluster"].router.decision_cpu_s
    later = times[len(times) // 2 :]
    assert scale["replicas"] == 1000 and len(later) > 100
    assert scale["decision_cpu_s_10min_1000"] == round(sum(later) * 600.0 / 0.1, 1) > 0
    assert scale["decisions_per_simulated_s"] == round(len(later) / 0.1, 1)
    assert 0 < scale["decision_cpu_share"] < 1
    assert scale["decision_cpu_share"] == pytest.approx(
        scale["decision_cpu_s_10min_1000"] / scale["cpu_s_10min_1000"], abs=0.002
    )


def test_the_report_says_whether_the_code_under_each_fleets_arms_changed_since_they_ran():
    """Carried arms are only as current as the code that simulated them (bench/sim.py --arms-from)."""
    from bench.sim import code_lines

    lines = code_lines(
        {
            "100": {"commits": [None], "dirty": False, "changed_since": None},
            "1000": {"commits": ["a" * 40], "dirty": False, "changed_since": []},
            "20": {"commits": ["b" * 40], "dirty": True, "changed_since": ["dspark/scheduler.py"]},
        }
    )
    assert lines == [
        "The arms at 100 replicas ran at an unrecorded commit: whether the simulated code changed since "
        "is unknown.\n",
        "The arms at 1000 replicas ran at aaaaaaaaaa; the simulated code is unchanged since.\n",
        "The arms at 20 replicas ran at bbbbbbbbbb with uncommitted changes to it; the simulated code "
        "changed since in 1 file (dspark/scheduler.py): simulate them again to trust them.\n",
    ]


def test_arms_simulated_here_are_stamped_with_this_checkouts_commit(tmp_path):
    from bench.code_version import stamp
    from bench.sim import REPO, SIM_CODE, main

    main(["--quick", "--skip-validation", "--skip-scale", "--workers", "1", "--out", str(tmp_path)])
    report = json.loads((tmp_path / "sim.json").read_text())
    here = stamp(REPO, SIM_CODE)
    assert {json.dumps(r["code"], sort_keys=True) for r in report["arms"]} == {
        json.dumps(here, sort_keys=True)
    }
    for fleet in report["arms_code"].values():
        assert fleet["commits"] == [here["commit"]]
        if here["commit"] is not None and not here["dirty"]:
            assert fleet["changed_since"] == []
