"""bench/target_sweep.py's report: one row per candidate with its figures, and the loss curves."""

from bench.target_sweep import CANDIDATES, plot, table


def _result(parameters: int, steps: int, ppl: tuple[float, float], short: float, long: float) -> dict:
    return {
        "parameters": parameters,
        "steps": steps,
        "tokens_trained": steps * 4 * 512,
        "train_wall_s": 390.4,
        "heldout_perplexity": {"code": ppl[0], "prose": ppl[1]},
        "greedy_loop_share": {"code": short, "prose": short / 2},
        "greedy_long_loop_share": {"code": long, "prose": long / 2},
        "losses": [9.0 - 0.01 * i for i in range(steps)],
    }


def test_the_table_has_a_row_per_candidate_with_its_figures_and_the_plot_is_written(tmp_path):
    results = {
        "candidates": {
            "big": _result(11_014_912, 52, (120.95, 325.58), 0.625, 0.5),
            "small": _result(5_049_088, 85, (93.24, 249.99), 0.4375, 0.47),
        }
    }
    text = table(results)
    assert "| big | 11.0M | 52 | 0.11M | 390 | 121.0 | 325.6 | 62% / 31% | 50% / 25% |" in text
    assert "| small | 5.0M | 85 | 0.17M | 390 | 93.2 | 250.0 | 44% / 22% | 47% / 24% |" in text
    plot(results, tmp_path / "curves.png")
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_candidates_include_the_demo_target_recipe():
    from drafter_service.demo.target import TargetShape, TrainConfig

    chosen = [c for c in CANDIDATES if c.shape == TargetShape()]
    assert len(chosen) == 1
    assert (chosen[0].steps, chosen[0].lr) == (TrainConfig().steps, TrainConfig().lr)
    assert len({c.name for c in CANDIDATES}) == len(CANDIDATES)
