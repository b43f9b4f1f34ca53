"""bench/sim.py's report: the validation against the real cluster as a table, real and simulated."""

from bench.sim import VALIDATED, validation_lines


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
