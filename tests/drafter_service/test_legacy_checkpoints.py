"""Checkpoints written in this project's previous layout still load, converted on the fly, and draft
exactly what the same weights in the DeepSpec layout draft."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoConfig

from drafter_service.models.checkpoint import build_drafter, save_drafter
from drafter_service.models.config import DrafterConfig
from dspark.checkpoint import load_checkpoint
from dspark.drafter import DraftRequest, create_drafter
from dspark.model import CausalLM
from dspark.sampling_params import SamplingParams


def old_name(name: str) -> str:
    """The previous layout's name of a tensor, written out (not legacy.py's table run backwards)."""
    parts = name.split(".")
    if name.startswith("hidden_norm."):
        return "context_norm." + parts[-1]
    if name.startswith("markov_head."):
        return name.removeprefix("markov_head.")
    if name.startswith("confidence_head.proj."):
        return "confidence_head." + parts[-1]
    if parts[0] == "layers" and parts[2] == "input_layernorm":
        return f"input_layernorms.{parts[1]}.weight"
    if parts[0] == "layers" and parts[2] in ("self_attn", "mlp"):
        return f"layers.{parts[1]}.{parts[3]}.{parts[4]}"
    return name


def old_chain_name(name: str) -> str:
    table = {
        "layers.0.input_layernorm.weight": "embed_norm.weight",
        "layers.0.hidden_norm.weight": "feature_norm.weight",
    }
    if name in table:
        return table[name]
    if name.startswith("layers.0."):
        parts = name.split(".")
        return "layer." + ".".join(parts[3:] if parts[2] in ("self_attn", "mlp") else parts[2:])
    return name


def old_config(cfg: DrafterConfig) -> dict:
    """The previous layout's config.json: its dataclass as it stood, every field written."""
    return {
        "architecture": cfg.kind,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "target_hidden_size": cfg.hidden_size,
        "target_layer_ids": cfg.target_layer_ids,
        "num_draft_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "intermediate_size": cfg.intermediate_size,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_parameters["rope_theta"],
        "block_size": cfg.block_size if cfg.is_block else cfg.ttt_length,
        "mask_token_id": cfg.mask_token_id,
        "markov_rank": cfg.markov_rank,
        "use_confidence_head": cfg.enable_confidence_head,
        "ttt_steps": cfg.ttt_length,
        "calibration_temperatures": {"1.0": [1.0, 1.5, 0.7, 1.1]} if cfg.enable_confidence_head else {},
        "training": {"steps": 40},
    }


BLOCK = dict(target_layer_ids=[0, 1], num_hidden_layers=2, block_size=4, mask_token_id=1, num_anchors=12)
CASES = {
    "dspark": dict(
        markov_rank=8,
        markov_head_type="vanilla",
        enable_confidence_head=True,
        confidence_head_with_markov=True,
        **BLOCK,
    ),
    "dflash": BLOCK,
    "eagle3": dict(target_layer_ids=[0, 1, 2], ttt_length=4),
    "mtp1": dict(target_layer_ids=[2], ttt_length=1),
}


@pytest.mark.parametrize("kind", CASES)
def test_previous_layout_loads_and_drafts_identically(tmp_path, qwen3_dir, kind):
    target = CausalLM.from_checkpoint(load_checkpoint(qwen3_dir, load_tokenizer=False))
    torch.manual_seed(0)
    cfg = DrafterConfig.for_target(AutoConfig.from_pretrained(qwen3_dir), kind, **CASES[kind])
    model = build_drafter(cfg, target.model.embed_tokens, target.lm_head)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)  # every tensor matters to the output
    rename = old_name if cfg.is_block else old_chain_name
    old_dir = tmp_path / "old"
    old_dir.mkdir()
    save_file(
        {rename(k): v.contiguous() for k, v in model.state_dict().items()}, str(old_dir / "model.safetensors")
    )
    (old_dir / "config.json").write_text(json.dumps(old_config(cfg)))
    if cfg.enable_confidence_head:
        model.cfg.sts_temperatures = {1.0: [1.0, 1.5, 0.7, 1.1]}
    save_drafter(model, tmp_path / "new")

    hidden = torch.randn(7, len(cfg.target_layer_ids) * cfg.hidden_size)
    tokens = [5, 9, 33, 7, 100, 3, 42, 8]
    params = SamplingParams(temperature=0.9, seed=3)
    proposals = []
    for directory in (old_dir, tmp_path / "new"):
        drafter = create_drafter(kind, target=target, path=str(directory), num_speculative_tokens=4)
        drafter.add_context("s", tokens[:-1], hidden)
        request = DraftRequest(
            "s", tokens, drafter.max_draft_tokens, params, torch.Generator().manual_seed(1)
        )
        proposals.append(drafter.propose([request])[0])
    old, new = proposals
    assert old.token_ids == new.token_ids and len(old.token_ids) == (1 if kind == "mtp1" else 4)
    assert torch.equal(old.probs, new.probs)
    if cfg.enable_confidence_head:
        assert torch.equal(old.confidence, new.confidence) and torch.equal(
            old.confidence_logits, new.confidence_logits
        )
