"""The SPS cost table: isotonic fit, interpolation, online refresh, profiling with the real runner,
the on-disk cache keyed by model / hardware / engine fingerprint, and `dspark profile`."""

from __future__ import annotations

import json
import os
import random
import shutil

import pytest
import torch
from scipy.optimize import isotonic_regression
from test_drafters import AdversarialDrafter

from dspark import SamplingParams, cli
from dspark.config import EngineConfig
from dspark.cost_table import CostTable, isotonic_non_increasing
from dspark.engine import Engine


def test_isotonic_fit_matches_reference():
    assert isotonic_non_increasing([3.0, 1.0, 2.0]) == [3.0, 1.5, 1.5]
    assert isotonic_non_increasing([1.0, 3.0], [3.0, 1.0]) == [1.5, 1.5]
    rng = random.Random(0)
    for _ in range(50):
        values = [rng.uniform(0, 10) - 0.1 * i for i in range(rng.randint(1, 30))]
        weights = [rng.uniform(0.5, 2) for _ in values]
        fit = isotonic_non_increasing(values, weights)
        assert all(a >= b for a, b in zip(fit, fit[1:]))
        reference = isotonic_regression(values, weights=weights, increasing=False).x
        assert fit == pytest.approx(list(reference))


def test_table_is_monotone_and_interpolated():
    table = CostTable([1, 4, 8], [10.0, 7.0, 9.0], max_tokens=10)
    assert table.smoothed == [10.0, 8.0, 8.0]  # the rise at B=8 is pooled away
    assert table(1) == 10.0 and table(2) == pytest.approx(10 - 2 / 3) and table(6) == 8.0
    assert table(0) == table(1) and table(50) == table(10) == 8.0
    with pytest.raises(ValueError):
        CostTable([2, 4], [1.0, 1.0], max_tokens=4)


def test_online_refresh_heals_a_drifted_table():
    table = CostTable([1, 8, 16], [100.0, 80.0, 50.0], max_tokens=16)
    before = {b: table(b) for b in range(1, 17)}
    for _ in range(60):  # the machine got twice as slow at every size
        for b in (1, 3, 8, 12, 16):
            table.observe(b, 2 / before[b], weight=0.2)
    assert [table(b) for b in range(1, 17)] == pytest.approx([before[b] / 2 for b in range(1, 17)], rel=1e-3)
    assert table.observations == 300
    frozen = CostTable([1, 8], [100.0, 80.0], max_tokens=8)
    frozen.observe(4, 1.0, weight=0.0)
    assert frozen(4) == pytest.approx(100 - 20 * 3 / 7) and frozen.observations == 0


def test_lookups_read_the_fitted_arrays_as_python_floats_before_and_after_observations():
    # SPS(B) and its convex envelope are read from Python lists kept beside the fitted arrays (faster to
    # index); they must carry the arrays' exact values, refitted every `refit_every` observations.
    table = CostTable([1, 4, 32, 128], [90.0, 95.0, 60.0, 20.0], max_tokens=200)
    for _ in range(2):
        got = [(table(b), table.convex(b)) for b in range(-1, 205)]
        clamp = [min(max(b, 1), 200) - 1 for b in range(-1, 205)]
        assert got == [(float(table._dense[k]), float(table._convex[k])) for k in clamp]
        assert all(type(a) is float and type(c) is float for a, c in got)
        for _ in range(table.refit_every):  # the table heals: both lookups follow the refit
            table.observe(50, 0.05, weight=0.5)
    assert table.observations == 2 * table.refit_every and table(50) != got[51][0]


def test_observations_reach_the_lookups_at_the_next_refit_and_the_saved_fit_at_once():
    # A refit costs more than a small target's step can spare, so observations are folded into the
    # rates at once but into the lookups every `refit_every` of them; to_dict reports them all.
    table = CostTable([1, 8, 16], [100.0, 80.0, 50.0], max_tokens=16)
    before = [table(b) for b in range(1, 17)]
    for _ in range(table.refit_every - 1):
        table.observe(8, 1 / 60, weight=0.5)
    assert [table(b) for b in range(1, 17)] == before and table.rates[1] < 80.0
    saved = table.to_dict()
    assert saved["smoothed"][1] == round(table.rates[1], 6) and table(8) == pytest.approx(table.rates[1])
    fresh = CostTable([1, 8, 16], [100.0, 80.0, 50.0], max_tokens=16)
    for _ in range(fresh.refit_every):
        fresh.observe(8, 1 / 60, weight=0.5)
    assert fresh(8) == pytest.approx(fresh.rates[1]) and fresh(8) < 80.0


def small_config(model_dir, cache_dir, **overrides) -> EngineConfig:
    options = dict(
        model=str(model_dir),
        scheduler="fixed",  # loads no table on its own: the tests call load_cost_table
        num_speculative_tokens=2,
        max_num_seqs=2,
        max_num_batched_tokens=12,
        num_kv_pages=16,
        kv_page_size=8,
        cost_table_dir=str(cache_dir),
        cost_table_profile="coarse",
    )
    return EngineConfig(**{**options, **overrides})


def test_profile_uses_the_runner_and_caches_by_fingerprint(qwen3_dir, tmp_path):
    cache = tmp_path / "cache"
    engine = Engine(small_config(qwen3_dir, cache))
    table = engine.load_cost_table()
    assert table.source == "profiled" and table.points[0] == 1 and table.points[-1] == 12
    assert {1, 2, 3, 4, 8} <= set(table.points)  # coarse: dense at small B, geometric above
    assert all(a >= b for a, b in zip(table.smoothed, table.smoothed[1:]))
    saved = json.loads(table.path.read_text())
    assert saved["fingerprint"]["engine"]["max_tokens"] == 12 and saved["points"] == table.points

    assert engine.load_cost_table().source == "cache"  # hit
    assert engine.load_cost_table(force=True).source == "profiled"
    # Another engine configuration, thread count or weight file: a miss, each under its own key.
    other = Engine(small_config(qwen3_dir, cache, max_num_batched_tokens=16))
    assert other.load_cost_table().source == "profiled"
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)
    try:
        assert engine.load_cost_table().source == "profiled"
    finally:
        torch.set_num_threads(threads)
    moved = shutil.copytree(qwen3_dir, tmp_path / "model")
    weights = next(moved.glob("*.safetensors"))
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))
    assert Engine(small_config(moved, cache)).load_cost_table().source == "profiled"
    assert len(list(cache.glob("sps-*.json"))) == 4
    assert engine.load_cost_table().source == "cache"


def test_scheduled_engine_loads_its_table_and_refreshes_it(qwen3_dir, tmp_path):
    confident = AdversarialDrafter(torch.zeros(384), gamma=2)  # reports confidences
    engine = Engine(small_config(qwen3_dir, tmp_path, scheduler="dspark"), drafter=confident)
    assert engine.cost_table is not None and engine.cost_table.source == "profiled"
    engine.add_request([5, 6, 7, 5, 6, 7], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    steps = 0
    while engine.has_unfinished():
        engine.step()
        steps += 1
    assert engine.cost_table.observations == steps  # every forward fed the online refresh
    with pytest.raises(RuntimeError):  # profiling would overwrite running requests' K/V
        engine.add_request([1, 2], SamplingParams(max_tokens=2))
        engine.load_cost_table(force=True)
    plain = Engine(small_config(qwen3_dir, tmp_path, scheduler="plain"), drafter=confident)
    assert plain.cost_table is None and plain.gamma == 0
    ngram = Engine(small_config(qwen3_dir, tmp_path, scheduler="dspark", drafter="ngram"))
    assert ngram.cost_table is None and ngram.gamma == 2  # no confidences: nothing to schedule by


def test_cli_profile(qwen3_dir, tmp_path, capsys):
    args = ["profile", "--model", str(qwen3_dir), "--coarse", "--cache-dir", str(tmp_path)]
    args += ["--max-num-seqs", "2", "--max-num-batched-tokens", "8", "--num-speculative-tokens", "2"]
    outputs = []
    for extra in ([], [], ["--force"]):
        assert cli.main(args + extra) == 0
        outputs.append(json.loads(capsys.readouterr().out.strip().splitlines()[-1]))
    assert [o["source"] for o in outputs] == ["profiled", "cache", "profiled"]
    assert outputs[0]["path"] == outputs[1]["path"] and outputs[0]["max_tokens"] == 8
