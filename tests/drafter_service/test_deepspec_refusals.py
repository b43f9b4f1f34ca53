"""What this loader does not implement fails loudly, naming the field: nothing is ignored or defaulted."""

from __future__ import annotations

import json

import pytest
import torch
from deepspec_fixture import draft_config, write_checkpoint
from safetensors.torch import load_file, save_file

from dspark import LLM, ModelLoadError


def without(key):
    return lambda c: c.pop(key)


def rope(**params):
    return lambda c: c.__setitem__("rope_parameters", params)


CONFIG_FAULTS = {  # id -> (change to config.json, what the error must name)
    "attention_bias": (lambda c: c.update(attention_bias=True), "attention_bias"),
    "hidden_act": (lambda c: c.update(hidden_act="gelu"), "hidden_act"),
    "sliding_window": (lambda c: c.update(use_sliding_window=True), "use_sliding_window"),
    "layer_types": (lambda c: c.update(layer_types=["sliding_attention", "full_attention"]), "layer_types"),
    "markov_head_type": (lambda c: c.update(markov_head_type="lstm"), "markov_head_type"),
    "gemma4": (lambda c: c.update(architectures=["Gemma4DSparkModel"]), "architectures"),
    "unknown_architecture": (lambda c: c.update(architectures=["DSparkDraftModel"]), "architectures"),
    "model_type": (lambda c: c.update(model_type="gemma4_text"), "model_type"),
    "unknown_field": (lambda c: c.update(final_logit_softcapping=30.0), "final_logit_softcapping"),
    "top_level_rope_theta": (lambda c: c.update(rope_theta=1e6), "rope_theta"),
    "no_num_anchors": (without("num_anchors"), "num_anchors"),
    "no_markov_head_type": (without("markov_head_type"), "markov_head_type"),
    "no_confidence_with_markov": (without("confidence_head_with_markov"), "confidence_head_with_markov"),
    "no_rope_parameters": (without("rope_parameters"), "rope_parameters"),
    "no_rope_theta": (rope(rope_type="default"), "rope_theta"),
    "dynamic_rope": (rope(rope_type="dynamic", rope_theta=1e4, factor=2.0), "rope_type"),
    "longrope": (
        rope(
            rope_type="longrope",
            rope_theta=1e4,
            short_factor=[1.0] * 8,
            long_factor=[1.0] * 8,
            original_max_position_embeddings=256,
        ),
        "rope_type",
    ),  # fmt: skip
    "layer_id": (lambda c: c.update(target_layer_ids=[-2, 1]), "target_layer_ids"),
    "layer_order": (lambda c: c.update(target_layer_ids=[1, -1]), "target_layer_ids"),
    "other_target": (lambda c: c.update(num_target_layers=5), "num_target_layers"),
    "mask_token_id": (lambda c: c.update(mask_token_id=10**6), "mask_token_id"),
    "bool_as_int": (lambda c: c.update(enable_confidence_head=1), "enable_confidence_head"),
}


@pytest.fixture
def drafter_dir(tmp_path, qwen3_dir):
    config = draft_config(qwen3_dir, target_layer_ids=[-1, 1], markov_head_type="gated")
    return write_checkpoint(tmp_path / "drafter", qwen3_dir, config)


def load(qwen3_dir, directory, drafter="dspark"):
    return LLM(str(qwen3_dir), drafter=drafter, drafter_model=str(directory), num_kv_pages=32)


@pytest.mark.parametrize("fault", CONFIG_FAULTS)
def test_config_fields_not_implemented_are_refused_by_name(qwen3_dir, drafter_dir, fault):
    change, named = CONFIG_FAULTS[fault]
    config = json.loads((drafter_dir / "config.json").read_text())
    change(config)
    (drafter_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match=named):
        load(qwen3_dir, drafter_dir)


def test_the_unchanged_fixture_loads(qwen3_dir, drafter_dir):
    assert load(qwen3_dir, drafter_dir).engine.drafter.name == "dspark"


def rewrite_weights(directory, change) -> None:
    weights = load_file(str(directory / "model.safetensors"))
    change(weights)
    save_file(weights, str(directory / "model.safetensors"), metadata={"format": "pt"})


@pytest.mark.parametrize(
    "change, named",
    [
        (lambda w: w.pop("markov_head.gate_proj.bias"), r"missing \['markov_head.gate_proj.bias'\]"),
        (lambda w: w.update({"model.fc.weight": w.pop("fc.weight")}), r"unexpected \['model.fc.weight'\]"),
        (lambda w: w.update({"fc.weight": w["fc.weight"][:, :64].clone()}), "fc.weight has shape"),
        (lambda w: w["embed_tokens.weight"].mul_(1.1), "embed_tokens.weight is not the target's"),
        (lambda w: w.update({"lm_head.weight": torch.randn(384, 64)}), "lm_head.weight is not the target's"),
        (lambda w: w.update({"lm_head.weight": torch.randn(385, 64)}), "lm_head.weight has shape"),
    ],
    ids=["missing", "unexpected", "shape", "embed_of_another_target", "lm_head_of_another", "lm_head_shape"],
)
def test_weights_that_do_not_match_are_refused_by_name(qwen3_dir, drafter_dir, change, named):
    rewrite_weights(drafter_dir, change)
    with pytest.raises(ModelLoadError, match=named):
        load(qwen3_dir, drafter_dir)


def test_the_kind_must_match_the_drafter_asked_for(qwen3_dir, drafter_dir):
    with pytest.raises(ModelLoadError, match="holds a 'dspark' drafter, not 'dflash'"):
        load(qwen3_dir, drafter_dir, drafter="dflash")
    (drafter_dir / "dspark_serve.json").write_text(json.dumps({"drafter": "eagle3"}))
    with pytest.raises(ModelLoadError, match="'eagle3' drafter cannot be a Qwen3DSparkModel"):
        load(qwen3_dir, drafter_dir)


@pytest.mark.parametrize(
    "body, named",
    [
        ({"temperatures": [1.0, 1.0]}, "hold 2 values, block_size is 4"),
        ({"temperatures": [1.0, 0.0, 1.0, 1.0]}, "numbers > 0"),
        ({"sts_temperatures": [1.0] * 4}, "'temperatures' must be"),
    ],
    ids=["length", "zero", "no_temperatures"],
)
def test_sts_files_that_cannot_apply_are_refused(qwen3_dir, drafter_dir, body, named):
    (drafter_dir / "sts_temperature_1.0.json").write_text(json.dumps(body))
    with pytest.raises(ModelLoadError, match=named):
        load(qwen3_dir, drafter_dir)
