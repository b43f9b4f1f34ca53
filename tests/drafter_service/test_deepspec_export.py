"""Our drafter checkpoints are DeepSpec checkpoints: checked field by field and key by key against
DeepSpec's layout (deepspec_fixture.py), plus what SGLang's DSpark loader expects of them."""

from __future__ import annotations

import json
import re

import pytest
import torch
from deepspec_fixture import COMMIT, CONFIG_KEYS, draft_config, tensor_shapes
from safetensors import safe_open
from test_deepspec_checkpoints import VARIANTS
from transformers import AutoConfig

from drafter_service.models.checkpoint import build_drafter, save_drafter
from drafter_service.models.config import DrafterConfig
from dspark.checkpoint import load_checkpoint
from dspark.model import CausalLM

assert COMMIT.startswith("afdfa7c9")


@pytest.fixture(scope="module")
def target(qwen3_dir) -> CausalLM:
    return CausalLM.from_checkpoint(load_checkpoint(qwen3_dir, load_tokenizer=False))


def ours(qwen3_dir, target, kind, directory, **deepspec_args):
    """Our drafter built with the same settings as DeepSpec's build_draft_config arguments, saved."""
    args = dict(target_layer_ids=[-1, 1], num_draft_layers=2, block_size=4, mask_token_id=1, num_anchors=16,
                confidence_head_alpha=1.0, confidence_head_with_markov=True, markov_rank=8,
                markov_head_type="vanilla") | deepspec_args  # fmt: skip
    conf = args["confidence_head_alpha"] > 0
    cfg = DrafterConfig.for_target(
        AutoConfig.from_pretrained(qwen3_dir),
        kind,
        target_layer_ids=args["target_layer_ids"],
        num_hidden_layers=args["num_draft_layers"],
        block_size=args["block_size"],
        mask_token_id=args["mask_token_id"],
        num_anchors=args["num_anchors"],
        markov_rank=args["markov_rank"],
        markov_head_type=args["markov_head_type"] if args["markov_rank"] else None,
        enable_confidence_head=conf,
        confidence_head_with_markov=conf and args["confidence_head_with_markov"],
    )
    save_drafter(build_drafter(cfg, target.model.embed_tokens, target.lm_head), directory)
    return directory, draft_config(qwen3_dir, **args)


@pytest.mark.parametrize("variant", VARIANTS)
def test_export_is_deepspec_layout_field_by_field_and_key_by_key(tmp_path, qwen3_dir, target, variant):
    kind, args = VARIANTS[variant]
    directory, deepspec = ours(qwen3_dir, target, kind, tmp_path / "ours", **args)
    written = json.loads((directory / "config.json").read_text())
    conditional = {"markov_head_type"} if deepspec["markov_rank"] else set()
    conditional |= {"confidence_head_with_markov"} if deepspec["enable_confidence_head"] else set()
    assert set(written) == set(deepspec) == CONFIG_KEYS | conditional
    for key in sorted(set(deepspec) - {"transformers_version", "dtype"}):
        assert written[key] == deepspec[key], key
    assert written["dtype"] == "float32" and written["transformers_version"]

    with safe_open(str(directory / "model.safetensors"), framework="pt") as f:
        assert f.metadata() == {"format": "pt"}
        shapes = {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
        # The stored embedding and LM head are the target's own, as DeepSpec stores them.
        assert torch.equal(f.get_tensor("embed_tokens.weight"), target.model.embed_tokens.weight)
        assert torch.equal(f.get_tensor("lm_head.weight"), target.lm_head.weight)
    assert shapes == tensor_shapes(deepspec)


# A stand-in for SGLang's DSpark loader (sglang 0.5.23 srt/models/dspark.py load_weights): the names it
# routes and the config fields it requires, checked without SGLang. Where sglang is installed,
# test_sglang_interchange.py runs SGLang's own draft model and loader on the checkpoint.
SGLANG_ROUTED = [
    r"(embed_tokens|lm_head)\.weight",  # skipped: the target's are shared
    r"markov_head\.(markov_w1|markov_w2)\.weight",
    r"markov_head\.(gate_proj|joint_proj)\.(weight|bias)",
    r"confidence_head\.proj\.(weight|bias)",
    r"layers\.\d+\.self_attn\.(q_proj|k_proj|v_proj|o_proj|q_norm|k_norm)\.weight",
    r"layers\.\d+\.mlp\.(gate_proj|up_proj|down_proj)\.weight",
    r"layers\.\d+\.(input_layernorm|post_attention_layernorm)\.weight",
    r"(fc|hidden_norm|norm)\.weight",
]


@pytest.mark.parametrize("head", ["vanilla", "gated", "rnn"])
def test_export_is_what_sglangs_dspark_loader_reads_stand_in(tmp_path, qwen3_dir, target, head):
    directory, _ = ours(
        qwen3_dir, target, "dspark", tmp_path / "ours", target_layer_ids=[0, 1], markov_head_type=head
    )
    config = json.loads((directory / "config.json").read_text())
    assert config["architectures"] == ["Qwen3DSparkModel"]  # among SGLang's EntryClass
    assert config["markov_rank"] > 0 and config["markov_head_type"] in ("vanilla", "gated", "rnn")
    assert 0 <= config["mask_token_id"] < config["vocab_size"] and config["block_size"] >= 1
    assert all(0 <= i < config["num_target_layers"] for i in config["target_layer_ids"])
    assert "enable_confidence_head" in config and not any(k.startswith("dspark_") for k in config)
    with safe_open(str(directory / "model.safetensors"), framework="pt") as f:
        names = list(f.keys())
        fc = tuple(f.get_slice("fc.weight").get_shape())
    assert [n for n in names if not any(re.fullmatch(p, n) for p in SGLANG_ROUTED)] == []
    assert fc == (config["hidden_size"], len(config["target_layer_ids"]) * config["hidden_size"])


def test_sts_temperatures_are_exported_in_sglangs_sts_format(tmp_path, qwen3_dir, target):
    directory, _ = ours(qwen3_dir, target, "dspark", tmp_path / "ours")
    from drafter_service.models.checkpoint import read_config

    cfg = read_config(directory)
    cfg.sts_temperatures = {0.0: [1.0, 1.2, 0.9, 2.0], 1.0: [0.8, 1.1, 1.3, 1.7]}
    model = build_drafter(cfg, target.model.embed_tokens, target.lm_head)
    save_drafter(model, directory)
    for t, temps in cfg.sts_temperatures.items():
        assert json.loads((directory / f"sts_temperature_{t}.json").read_text()) == {"temperatures": temps}
    assert read_config(directory).sts_temperatures == cfg.sts_temperatures
    assert json.loads((directory / "dspark_serve.json").read_text())["drafter"] == "dspark"


def test_eagle3_export_is_deepspecs_qwen3_eagle3_layout(tmp_path, qwen3_dir, target):
    """Qwen3Eagle3Model (deepspec/modeling/eagle3/qwen3 at the same commit): one decoder layer whose
    attention reads [input_layernorm(embedding) ; hidden_norm(feature)]."""
    cfg = DrafterConfig.for_target(
        AutoConfig.from_pretrained(qwen3_dir), "eagle3", target_layer_ids=[0, 1], ttt_length=3
    )
    save_drafter(build_drafter(cfg, target.model.embed_tokens, target.lm_head), tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["Qwen3Eagle3Model"] and config["model_type"] == "qwen3"
    assert (config["ttt_length"], config["step_loss_decay"], config["draft_num_hidden_layers"]) == (3, 0.8, 1)
    h, q, kv, inter, d = 64, 64, 32, 128, 16
    layer = {"hidden_norm.weight": (h,), "input_layernorm.weight": (h,),
             "post_attention_layernorm.weight": (h,), "self_attn.q_proj.weight": (q, 2 * h),
             "self_attn.k_proj.weight": (kv, 2 * h), "self_attn.v_proj.weight": (kv, 2 * h),
             "self_attn.o_proj.weight": (h, q), "self_attn.q_norm.weight": (d,),
             "self_attn.k_norm.weight": (d,), "mlp.gate_proj.weight": (inter, h),
             "mlp.up_proj.weight": (inter, h), "mlp.down_proj.weight": (h, inter)}  # fmt: skip
    expected = {
        "embed_tokens.weight": (384, h),
        "lm_head.weight": (384, h),
        "fc.weight": (h, 2 * h),
        "norm.weight": (h,),
    }
    expected |= {f"layers.0.{name}": shape for name, shape in layer.items()}
    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as f:
        assert {n: tuple(f.get_slice(n).get_shape()) for n in f.keys()} == expected
