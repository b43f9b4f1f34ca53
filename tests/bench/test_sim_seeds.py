"""bench/sim_seeds.py: the summary's arms at 80% load under further seeds, with sim.json's own settings."""

import json

import pytest

from bench.sim_seeds import by_seed, main, recorded_scenarios, spread
from sim.scenario import Scenario, run


def _figures(attainment: float, goodput: float) -> dict:
    return {
        "attainment": attainment,
        "goodput_rps": goodput,
        "verify_per_round": 4.0,
        "accepted_per_round": 2.0,
    }


def test_each_seed_sets_ours_over_the_baseline_and_the_seeds_give_each_figures_range():
    runs = [
        (0, "pow2+fixed", _figures(0.35, 50.0)),
        (0, "sla+controller", _figures(0.997, 140.0)),
        (1, "pow2+fixed", _figures(0.40, 56.0)),
        (1, "sla+controller", _figures(0.995, 140.0)),
    ]
    seeds = by_seed(runs)
    assert [seeds[0]["ratio"], seeds[1]["ratio"]] == [2.8, 2.5]
    ranges = spread(seeds)
    assert ranges["ratio"] == {"min": 2.5, "max": 2.8, "spread": 0.12}
    assert ranges["pow2+fixed"]["goodput_rps"] == {"min": 50.0, "max": 56.0, "spread": 0.12}
    assert ranges["sla+controller"]["attainment"]["spread"] == round(0.997 / 0.995 - 1, 4)


def test_the_seeds_run_with_the_settings_the_report_recorded_and_seed_0_comes_from_it(tmp_path):
    settings = dict(
        profile="gpu_dsv4flash_rocm", replicas=2, load=0.8, duration_s=2.0, warmup_s=0.5, drain_s=3.0
    )
    arms = []
    for router, scheduler in (("pow2", "fixed"), ("sla", "engine"), ("sla", "controller")):
        result = run(Scenario(router=router, scheduler=scheduler, **settings))
        result.pop("cluster")
        result.pop("timeline")
        result["scenario"]["workload"] = {}
        arms.append(result)
    # An arm at another load is not one of the summary's.
    other = json.loads(json.dumps(arms[0]))
    other["scenario"]["load"] = 0.5
    report = tmp_path / "sim.json"
    report.write_text(json.dumps({"arms": [other, *arms]}))
    out = main(
        ["--seeds", "1", "--replicas", "2", "--workers", "1", "--report", str(report), "--out", str(tmp_path)]
    )
    assert out["seeds"] == [0, 1]
    assert out["by_seed"][0]["pow2+fixed"]["attainment"] == arms[0]["summary"]["attainment"]
    # Seed 1 is the recorded scenario with only its seed changed: simulated alone, the same figures.
    again = run(Scenario(router="sla", scheduler="controller", seed=1, **settings))
    assert out["by_seed"][1]["sla+controller"]["goodput_rps"] == again["summary"]["goodput_rps"]
    assert out["by_seed"][1]["sla+controller"]["accepted_per_round"] == again["accepted_per_round"]
    assert "| 1 | sla+controller |" in (tmp_path / "sim_seeds_2.md").read_text()
    with pytest.raises(SystemExit, match="no run of"):
        recorded_scenarios({"arms": [other]}, 2)
