"""A DSpark drafter checkpoint in DeepSpec's exact layout, written from its documented layout.

Follows github.com/deepseek-ai/DeepSpec at commit afdfa7c9382a3341a3e6f17756dd816da79f132c:
`deepspec/modeling/dspark/qwen3/config.py::build_draft_config` (the target's config copied, then the
drafter's fields set), `Qwen3DSparkModel` (module names), saved by transformers' `save_pretrained`
(config.json, model.safetensors with metadata {"format": "pt"}, embed_tokens / lm_head stored as
copies of the target's). No DeepSpec code is used: the keys and names below are the layout itself.
Weights are random, at scales that make every part of the math visible in the outputs.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

COMMIT = "afdfa7c9382a3341a3e6f17756dd816da79f132c"

# Every key of a Qwen3DSparkModel config.json (transformers 5 `save_pretrained` of the copied Qwen3
# config). `markov_head_type` only when markov_rank > 0, `confidence_head_with_markov` only when the
# confidence head is enabled: build_draft_config sets them only then.
CONFIG_KEYS = {
    "architectures", "attention_bias", "attention_dropout", "block_size", "bos_token_id",
    "dtype", "enable_confidence_head", "eos_token_id", "head_dim", "hidden_act", "hidden_size",
    "initializer_range", "intermediate_size", "layer_types", "markov_rank", "mask_token_id",
    "max_position_embeddings", "max_window_layers", "model_type", "num_anchors", "num_attention_heads",
    "num_hidden_layers", "num_key_value_heads", "num_target_layers", "pad_token_id", "rms_norm_eps",
    "rope_parameters", "sliding_window", "target_layer_ids", "tie_word_embeddings",
    "transformers_version", "use_cache", "use_sliding_window", "vocab_size",
}  # fmt: skip


def tensor_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """Every tensor of a Qwen3DSparkModel state dict (no prefix), with its shape."""
    h, v, inter = config["hidden_size"], config["vocab_size"], config["intermediate_size"]
    q, kv = (
        config["num_attention_heads"] * config["head_dim"],
        config["num_key_value_heads"] * config["head_dim"],
    )
    r, d = config["markov_rank"], config["head_dim"]
    shapes = {"embed_tokens.weight": (v, h), "lm_head.weight": (v, h), "norm.weight": (h,),
              "fc.weight": (h, len(config["target_layer_ids"]) * h), "hidden_norm.weight": (h,)}  # fmt: skip
    for i in range(config["num_hidden_layers"]):
        p = f"layers.{i}."
        shapes |= {p + "self_attn.q_proj.weight": (q, h), p + "self_attn.k_proj.weight": (kv, h),
                   p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, q),
                   p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,),
                   p + "mlp.gate_proj.weight": (inter, h), p + "mlp.up_proj.weight": (inter, h),
                   p + "mlp.down_proj.weight": (h, inter), p + "input_layernorm.weight": (h,),
                   p + "post_attention_layernorm.weight": (h,)}  # fmt: skip
    if r > 0:
        shapes |= {"markov_head.markov_w1.weight": (v, r), "markov_head.markov_w2.weight": (v, r)}
        if config["markov_head_type"] == "gated":
            shapes |= {"markov_head.gate_proj.weight": (r, h + r), "markov_head.gate_proj.bias": (r,)}
        if config["markov_head_type"] == "rnn":
            shapes |= {
                "markov_head.joint_proj.weight": (3 * r, 2 * r + h),
                "markov_head.joint_proj.bias": (3 * r,),
            }
    if config["enable_confidence_head"]:
        width = h + (r if config["confidence_head_with_markov"] else 0)
        shapes |= {"confidence_head.proj.weight": (1, width), "confidence_head.proj.bias": (1,)}
    return shapes


def draft_config(
    target_dir: Path,
    *,
    target_layer_ids: list[int],
    num_draft_layers: int = 2,
    block_size: int = 4,
    mask_token_id: int = 1,
    num_anchors: int = 16,
    confidence_head_alpha: float = 1.0,
    confidence_head_with_markov: bool = True,
    markov_rank: int = 8,
    markov_head_type: str = "vanilla",
    rope_theta: float | None = None,
) -> dict:
    """What build_draft_config + save_pretrained write for the target in `target_dir`."""
    target = json.loads((target_dir / "config.json").read_text())
    config = copy.deepcopy(target)
    config.update(
        architectures=["Qwen3DSparkModel"],
        num_target_layers=target["num_hidden_layers"],
        num_hidden_layers=num_draft_layers,
        block_size=block_size,
        tie_word_embeddings=False,
        layer_types=["full_attention"] * num_draft_layers,
        mask_token_id=mask_token_id,
        target_layer_ids=target_layer_ids,
        num_anchors=num_anchors,
        enable_confidence_head=confidence_head_alpha > 0,
        markov_rank=markov_rank,
        transformers_version="5.10.2",  # DeepSpec's pin
    )
    config.pop("confidence_head_with_markov", None)
    if config["enable_confidence_head"]:
        config["confidence_head_with_markov"] = confidence_head_with_markov
    if markov_rank > 0:
        config["markov_head_type"] = markov_head_type
    if rope_theta is not None:  # a drafter whose RoPE base is not its target's: its own must be read
        config["rope_parameters"] = {**config["rope_parameters"], "rope_theta": rope_theta}
    return config


def write_checkpoint(
    directory: Path, target_dir: Path, config: dict, seed: int = 0, dtype: torch.dtype = torch.float32
) -> Path:
    """config.json and model.safetensors in `dtype` (DeepSpec trains and saves in bfloat16);
    embed_tokens / lm_head copied from the target's weights."""
    target = load_file(str(target_dir / "model.safetensors"))
    embed = target["model.embed_tokens.weight"]
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, shape in tensor_shapes(config).items():
        if name == "embed_tokens.weight":
            tensors[name] = embed.clone()
        elif name == "lm_head.weight":
            tensors[name] = target.get("lm_head.weight", embed).clone()  # a tied target's is its embedding
        elif name.endswith("norm.weight"):
            tensors[name] = 1.0 + 0.1 * torch.randn(shape, generator=gen)
        else:
            scale = 0.5 if name.startswith("markov_head") else 0.3 / max(1.0, shape[-1] ** 0.5 / 8)
            tensors[name] = scale * torch.randn(shape, generator=gen)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {name: t.to(dtype) for name, t in tensors.items()}
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    written = {**config, "dtype": str(dtype).removeprefix("torch.")}
    (directory / "config.json").write_text(json.dumps(written, indent=2, sort_keys=True))
    return directory
