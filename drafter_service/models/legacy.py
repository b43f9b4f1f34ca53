"""Reading drafters saved in this project's previous layout (before the DeepSpec layout).

That layout's config.json was our dataclass as it stood (`architecture`, `num_draft_layers`,
`target_hidden_size`, `rope_theta`, `use_confidence_head`, `ttt_steps`, `calibration_temperatures`,
`training`) and its weights had flat names. The loader converts both on the fly (checkpoint.py);
`save_drafter` on the loaded drafter writes it in the new layout. `make models` builds new ones.
"""

from __future__ import annotations

import re

from drafter_service.models.config import DrafterConfig
from dspark.errors import ModelLoadError

OLD_FIELDS = {"architecture", "vocab_size", "hidden_size", "target_hidden_size", "target_layer_ids",
    "num_draft_layers", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
    "rms_norm_eps", "rope_theta", "block_size", "mask_token_id", "markov_rank", "use_confidence_head",
    "ttt_steps", "calibration_temperatures", "training"}  # fmt: skip
# The old anchors-per-sequence training default: the old layout did not record it.
OLD_NUM_ANCHORS = 12

_ATTN = r"(q_proj|k_proj|v_proj|o_proj|q_norm|k_norm)"
_MLP = r"(gate_proj|up_proj|down_proj)"
_RENAMES = [  # (old name pattern, new name) for block drafters, then chain drafters
    (r"context_norm\.(.*)", r"hidden_norm.\1"),
    (r"input_layernorms\.(\d+)\.(.*)", r"layers.\1.input_layernorm.\2"),
    (rf"layers\.(\d+)\.{_ATTN}\.(.*)", r"layers.\1.self_attn.\2.\3"),
    (rf"layers\.(\d+)\.{_MLP}\.(.*)", r"layers.\1.mlp.\2.\3"),
    (r"layers\.(\d+)\.post_attention_layernorm\.(.*)", r"layers.\1.post_attention_layernorm.\2"),
    (r"(markov_w[12])\.(.*)", r"markov_head.\1.\2"),
    (r"confidence_head\.(weight|bias)", r"confidence_head.proj.\1"),
    (r"embed_norm\.(.*)", r"layers.0.input_layernorm.\1"),
    (r"feature_norm\.(.*)", r"layers.0.hidden_norm.\1"),
    (rf"layer\.{_ATTN}\.(.*)", r"layers.0.self_attn.\1.\2"),
    (rf"layer\.{_MLP}\.(.*)", r"layers.0.mlp.\1.\2"),
    (r"layer\.post_attention_layernorm\.(.*)", r"layers.0.post_attention_layernorm.\1"),
    (r"(fc|norm)\.weight", r"\1.weight"),
]


def is_legacy(raw: dict) -> bool:
    return "architecture" in raw and "architectures" not in raw


def convert_config(raw: dict, num_target_layers: int, max_position_embeddings: int) -> DrafterConfig:
    """The old layout's config.json as a DeepSpec-layout config (same math); the target supplies what
    the old layout did not record."""
    unknown = sorted(set(raw) - OLD_FIELDS)
    if unknown:
        raise ModelLoadError(f"config.json in the previous layout has unknown fields {unknown}")
    kind = raw["architecture"]
    if raw.get("target_hidden_size", raw["hidden_size"]) != raw["hidden_size"]:
        raise ModelLoadError("target_hidden_size differs from hidden_size")
    common = dict(
        vocab_size=raw["vocab_size"],
        hidden_size=raw["hidden_size"],
        num_hidden_layers=raw.get("num_draft_layers", 1),
        num_attention_heads=raw.get("num_attention_heads", 6),  # the old dataclass defaults
        num_key_value_heads=raw.get("num_key_value_heads", 2),
        head_dim=raw.get("head_dim", 64),
        intermediate_size=raw.get("intermediate_size", 1024),
        rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
        rope_parameters={"rope_type": "default", "rope_theta": raw.get("rope_theta", 10000.0)},
        max_position_embeddings=max_position_embeddings,
        num_target_layers=num_target_layers,
        target_layer_ids=raw["target_layer_ids"],
        sts_temperatures={float(t): v for t, v in raw.get("calibration_temperatures", {}).items()},
        training=raw.get("training", {}),
    )
    if kind in ("dspark", "dflash"):
        rank = raw.get("markov_rank", 0)
        conf = raw.get("use_confidence_head", False)
        return DrafterConfig(
            kind,
            block_size=raw.get("block_size", 7),
            mask_token_id=raw["mask_token_id"],
            num_anchors=OLD_NUM_ANCHORS,
            markov_rank=rank,
            markov_head_type="vanilla" if rank > 0 else None,
            enable_confidence_head=conf,
            confidence_head_with_markov=conf and rank > 0,
            **common,
        )
    return DrafterConfig(kind, ttt_length=raw.get("ttt_steps", 1), **common)


def rename(name: str) -> str:
    """The DeepSpec-layout name of a tensor of the old layout."""
    for pattern, replacement in _RENAMES:
        if re.fullmatch(pattern, name):
            return re.sub(pattern, replacement, name)
    raise ModelLoadError(f"weight {name!r} is not part of the previous drafter layout")
