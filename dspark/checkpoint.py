"""Loading a local Hugging Face checkpoint directory: config, safetensors weights, tokenizer.

Only safetensors are read, so nothing from disk is ever unpickled; no remote code runs. Weights are
read lazily, tensor by tensor, and a reader may take only a slice of each (a tensor-parallel rank
reads its own shard and nothing else: dspark/tp.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from dspark.errors import ModelLoadError

SUPPORTED_ARCHITECTURES = {"qwen3": "Qwen3ForCausalLM", "llama": "LlamaForCausalLM"}
# RoPE variants whose frequencies do not depend on the sequence length at run time.
STATIC_ROPE_TYPES = {"default", "linear", "llama3", "yarn", "proportional"}


@dataclass(frozen=True)
class ModelConfig:
    """The shape of a decoder-only target, read from a Qwen3 or Llama config.json."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    mlp_bias: bool
    qk_norm: bool
    eos_token_ids: tuple[int, ...]


@dataclass
class Checkpoint:
    """What a checkpoint directory holds; its weights stay on disk until `read_weights`."""

    config: ModelConfig
    weight_files: list[Path]
    inv_freq: torch.Tensor
    rope_scaling: float
    tokenizer: object | None
    name: str


# Reads the part of checkpoint tensor `name` a model holds from its lazy slice, or None to skip it.
Take = Callable[[str, object], torch.Tensor | None]


def read_whole(name: str, lazy) -> torch.Tensor:
    return lazy[:]


def read_weights(
    ckpt: Checkpoint, dtype: torch.dtype, device: torch.device | str = "cpu", take: Take = read_whole
) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors, each read as `take` slices it into its own storage of `dtype` on `device`.

    safetensors hands out views of a memory map of the whole file; copying each slice out at once
    means the model holds exactly its slices, and the map is let go when the file closes.
    """
    weights: dict[str, torch.Tensor] = {}
    for file in ckpt.weight_files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                if ckpt.config.tie_word_embeddings and name == "lm_head.weight":
                    continue  # the embedding's weight serves both
                view = take(name, f.get_slice(name))
                if view is not None:
                    weights[name] = torch.empty(view.shape, dtype=dtype, device=device).copy_(view)
    return weights


def load_checkpoint(path: str | Path, load_tokenizer: bool = True) -> Checkpoint:
    """Read config and tokenizer from `path` and find its weights; errors name what is missing."""
    directory = Path(path)
    if not directory.is_dir():
        raise ModelLoadError(f"model directory {str(directory)!r} does not exist")
    if not (directory / "config.json").is_file():
        raise ModelLoadError(f"model directory {str(directory)!r} has no config.json")
    weight_files = sorted(directory.glob("*.safetensors"))
    if not weight_files:
        found = sorted(p.name for p in directory.iterdir())
        raise ModelLoadError(
            f"model directory {str(directory)!r} has no *.safetensors weights (found: {found}); "
            "only safetensors checkpoints are served, pickled weights are never loaded"
        )
    hf_config = _load_hf_config(directory)
    config = model_config_from_hf(hf_config, directory)
    inv_freq, scaling = rope_frequencies(hf_config)
    tokenizer = _load_tokenizer(directory) if load_tokenizer else None
    return Checkpoint(config, weight_files, inv_freq, scaling, tokenizer, directory.name)


def _load_hf_config(directory: Path):
    from transformers import AutoConfig

    raw = json.loads((directory / "config.json").read_text())
    model_type = raw.get("model_type")
    if model_type not in SUPPORTED_ARCHITECTURES:
        raise ModelLoadError(
            f"model_type {model_type!r} in {directory}/config.json is not supported; "
            f"supported: {sorted(SUPPORTED_ARCHITECTURES)}"
        )
    return AutoConfig.from_pretrained(str(directory), trust_remote_code=False)


def model_config_from_hf(hf, directory: Path | str = "") -> ModelConfig:
    if getattr(hf, "hidden_act", "silu") != "silu":
        raise ModelLoadError(f"{directory}: hidden_act {hf.hidden_act!r} is not supported (silu only)")
    if getattr(hf, "use_sliding_window", False):
        raise ModelLoadError(f"{directory}: sliding-window attention is not supported")
    eos = getattr(hf, "eos_token_id", None)
    eos_ids = tuple(eos) if isinstance(eos, list | tuple) else (() if eos is None else (int(eos),))
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
    return ModelConfig(
        model_type=hf.model_type,
        vocab_size=hf.vocab_size,
        hidden_size=hf.hidden_size,
        intermediate_size=hf.intermediate_size,
        num_layers=hf.num_hidden_layers,
        num_heads=hf.num_attention_heads,
        num_kv_heads=getattr(hf, "num_key_value_heads", None) or hf.num_attention_heads,
        head_dim=head_dim,
        rms_norm_eps=hf.rms_norm_eps,
        max_position_embeddings=hf.max_position_embeddings,
        tie_word_embeddings=bool(getattr(hf, "tie_word_embeddings", False)),
        attention_bias=bool(getattr(hf, "attention_bias", False)),
        mlp_bias=bool(getattr(hf, "mlp_bias", False)),
        qk_norm=hf.model_type == "qwen3",
        eos_token_ids=eos_ids,
    )


def rope_frequencies(hf) -> tuple[torch.Tensor, float]:
    """Inverse frequencies (fp32, on the CPU) and cos/sin scaling, exactly as transformers computes them
    from `rope_parameters`. Nothing is guessed: a missing type or base, a type whose frequencies change
    with the running sequence length, or a partial rotary dimension is refused, naming the field."""
    params = dict(getattr(hf, "rope_parameters", None) or {})
    rope_type = params.get("rope_type")
    if rope_type is None:
        raise ModelLoadError("rope_parameters.rope_type is missing")
    if rope_type not in STATIC_ROPE_TYPES:
        raise ModelLoadError(
            f"rope_parameters.rope_type {rope_type!r} is not supported (its frequencies depend on the "
            f"running sequence length, or transformers does not know it); "
            f"supported: {sorted(STATIC_ROPE_TYPES)}"
        )
    if params.get("rope_theta") is None:
        raise ModelLoadError("rope_parameters.rope_theta (the RoPE base) is missing")
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
    if rope_type == "default":
        if params.get("partial_rotary_factor", getattr(hf, "partial_rotary_factor", 1.0)) != 1.0:
            raise ModelLoadError("partial_rotary_factor != 1 is not supported")
        theta = float(params["rope_theta"])
        exponents = torch.arange(0, head_dim, 2, dtype=torch.float, device="cpu") / head_dim
        return 1.0 / (theta**exponents), 1.0
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](hf, torch.device("cpu"))
    if inv_freq.numel() != head_dim // 2:
        raise ModelLoadError("partial_rotary_factor != 1 is not supported")
    return inv_freq.float(), float(scaling)


def _load_tokenizer(directory: Path):
    if not any((directory / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(directory), trust_remote_code=False)
