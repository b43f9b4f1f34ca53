"""Our artefacts read by SGLang 0.5.23's OWN loaders (installed without its GPU dependencies): the SPS
table (dspark_sps.load_sps_table_from_path), STS temperatures (dspark_sts.load_sts_calibration_from_path),
and a drafter checkpoint: its config.json through SGLang's DSpark config parser and runtime resolution,
its Markov and confidence heads into SGLang's own head modules (models/dspark.py build_markov_head /
build_confidence_head) with SGLang's weight loader, name by name and shape by shape, and the whole
checkpoint round trip: loaded into SGLang's full DSpark draft model (Qwen3DSparkModel, built on CPU in a
process of its own, sglang_draft_model.py) and read back out of it equal to what we saved."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from sglang_cpu import require_sglang

require_sglang()

from drafter_fixtures import save_untrained_dspark  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from transformers import AutoConfig  # noqa: E402

from deployments.sglang_artifacts import read_sps_points, write_sps_table  # noqa: E402
from drafter_service.models.extras import sts_path, write_sts  # noqa: E402
from dspark.cost_table import CostTable  # noqa: E402


def test_our_sps_table_is_what_sglangs_lookup_returns_at_every_batch(tmp_path):
    from sglang.srt.speculative.dspark_components.dspark_sps import SpsCostTable, load_sps_table_from_path

    ours = CostTable([1, 2, 4, 16, 64, 200], [900.0, 880.0, 850.0, 700.0, 400.0, 150.0], max_tokens=256)
    path = write_sps_table(ours, tmp_path / "sps.json")
    theirs = load_sps_table_from_path(str(path))
    assert isinstance(theirs, SpsCostTable) and theirs.max_batch_tokens == 256
    for b in range(1, 257):
        assert theirs.lookup(b) == pytest.approx(ours(b), abs=1e-6), b
    assert theirs.lookup(10_000) == pytest.approx(ours(256))  # both clamp beyond the table
    assert read_sps_points(path)[:3] == [[1, 900.0], [2, 880.0], [3, pytest.approx(865.0)]]


def test_sglangs_additive_table_has_no_one_dimensional_reading(tmp_path):
    path = tmp_path / "additive.json"
    path.write_text(json.dumps({"bias_seconds": 0.01, "bs_probes": [1], "alpha_seconds": [0.0],
                                "m_probes": [1], "theta_seconds": [0.0]}))  # fmt: skip
    assert read_sps_points(path) is None


def test_sts_files_are_read_by_sglangs_calibration_loader(tmp_path):
    from sglang.srt.speculative.dspark_components.dspark_sts import load_sts_calibration_from_path

    path = sts_path(tmp_path, 0.7)
    write_sts(path, [1.0, 1.25, 0.8, 2.0], num_samples=4096)
    calibration = load_sts_calibration_from_path(str(path))
    assert list(calibration.temperatures) == [1.0, 1.25, 0.8, 2.0] and calibration.num_samples == 4096


@pytest.mark.parametrize("head", ["vanilla", "gated", "rnn"])
def test_a_drafter_checkpoint_loads_through_sglangs_dspark_code(tmp_path, qwen3_dir, head, monkeypatch):
    from sglang.srt.model_loader.weight_utils import default_weight_loader
    from sglang.srt.models.dspark import build_confidence_head, build_markov_head
    from sglang.srt.speculative.dspark_components.dspark_config import (
        parse_dspark_draft_config,
        resolve_runtime_config,
    )

    directory = save_untrained_dspark(qwen3_dir, tmp_path / "dspark", gamma=5, markov_head_type=head)
    config = AutoConfig.from_pretrained(directory)  # how SGLang reads it (hf_transformers_utils.get_config)
    parsed = parse_dspark_draft_config(draft_hf_config=config)
    assert (parsed.gamma, parsed.target_layer_ids, parsed.mask_token_id) == (5, [0, 1], 1)
    assert (parsed.markov_rank, parsed.markov_head_type) == (8, head)
    runtime = resolve_runtime_config(draft_hf_config=config, speculative_num_draft_tokens=None,
                                     target_vocab_size=config.vocab_size)  # fmt: skip
    assert (runtime.gamma, runtime.verify_num_draft_tokens) == (5, 6)

    monkeypatch.setenv("SGLANG_RAGGED_VERIFY_MODE", "compact")  # SGLang builds the confidence head then
    heads = {"markov_head": build_markov_head(config), "confidence_head": build_confidence_head(config)}
    expected = {
        f"{prefix}.{name}": p for prefix, module in heads.items() for name, p in module.named_parameters()
    }
    with safe_open(str(directory / "model.safetensors"), framework="pt") as f:
        ours = {name: f.get_tensor(name) for name in f.keys() if name.split(".")[0] in heads}
    assert {n: tuple(t.shape) for n, t in ours.items()} == {n: tuple(p.shape) for n, p in expected.items()}
    for name, tensor in ours.items():
        default_weight_loader(expected[name], tensor)  # SGLang's loader for these parameters
        assert torch.equal(expected[name].data, tensor.to(expected[name].dtype))


# SGLang stacks these projections into one parameter each (models/dflash.py load_weights), in this order.
STACKED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def unstack(sglang_params: dict, rows: dict[str, int]) -> dict:
    """SGLang's parameters under our checkpoint's names: each stack split back, in SGLang's order, by the
    row counts of our projections (`rows`)."""
    ours = {}
    for name, tensor in sglang_params.items():
        stacked = next((s for s in STACKED if f".{s}." in name), None)
        if stacked is None:
            ours[name] = tensor
            continue
        parts = [name.replace(stacked, part) for part in STACKED[stacked]]
        ours |= dict(zip(parts, torch.split(tensor, [rows[part] for part in parts])))
    return ours


def test_a_drafter_checkpoint_round_trips_through_sglangs_dspark_draft_model(tmp_path, qwen3_dir):
    """Saved by us, loaded by SGLang's Qwen3DSparkModel.load_weights (every parameter written, none left
    NaN), read back out of SGLang's parameters equal to every tensor we saved but the embedding and LM
    head (SGLang shares the target's), for each Markov head type."""
    heads = ("vanilla", "gated", "rnn")
    drafters = [save_untrained_dspark(qwen3_dir, tmp_path / h, gamma=5, markov_head_type=h) for h in heads]
    outs = [tmp_path / f"{h}.sglang.safetensors" for h in heads]
    script = Path(__file__).with_name("sglang_draft_model.py")
    pairs = [str(p) for pair in zip(drafters, outs) for p in pair]
    done = subprocess.run([sys.executable, str(script), str(qwen3_dir), *pairs], capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    for drafter, out in zip(drafters, outs):
        saved = load_file(str(drafter / "model.safetensors"))
        with safe_open(str(out), framework="pt") as f:
            assert (f.metadata()["class"], f.metadata()["gamma"]) == ("Qwen3DSparkModel", "5")
        held = load_file(str(out))
        assert [name for name, t in held.items() if torch.isnan(t).any()] == []  # SGLang loaded them all
        back = unstack(held, {name: t.shape[0] for name, t in saved.items()})
        assert set(back) == set(saved) - {"embed_tokens.weight", "lm_head.weight"}, drafter.name
        for name, tensor in back.items():
            assert torch.equal(tensor, saved[name].to(tensor.dtype)), (drafter.name, name)
