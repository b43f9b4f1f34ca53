"""Drafter checkpoints: `model.safetensors` + DeepSpec-style `config.json` (calibration included).

The target's embeddings and LM head are not stored: a drafter is always loaded beside its target and
takes them from it. Only safetensors are read, so nothing is ever unpickled.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from drafter_service.models.config import DrafterConfig


def build_drafter(cfg: DrafterConfig, embed: nn.Embedding, lm_head: nn.Linear) -> nn.Module:
    from drafter_service.models.autoregressive import ARDrafter
    from drafter_service.models.block import BlockDrafter

    return (BlockDrafter if cfg.is_block else ARDrafter)(cfg, embed, lm_head)


def save_drafter(model: nn.Module, directory: str | Path) -> None:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    save_file(
        {k: v.detach().contiguous() for k, v in model.state_dict().items()},
        str(directory / "model.safetensors"),
    )
    model.cfg.save(directory)


def load_drafter(
    directory: str | Path,
    embed: nn.Embedding,
    lm_head: nn.Linear,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> nn.Module:
    """Load a drafter beside its target, its weights cast to `dtype` on `device` (default: those of
    the target's embeddings, which the drafter shares and must compute with)."""
    directory = Path(directory)
    if not (directory / "config.json").is_file():
        raise FileNotFoundError(f"drafter directory {str(directory)!r} has no config.json")
    weights = directory / "model.safetensors"
    if not weights.is_file():
        raise FileNotFoundError(
            f"drafter directory {str(directory)!r} has no model.safetensors (safetensors only)"
        )
    cfg = DrafterConfig.load(directory)
    if cfg.vocab_size != embed.num_embeddings or cfg.hidden_size != embed.embedding_dim:
        raise ValueError(
            f"drafter {directory} was trained for vocab {cfg.vocab_size} / hidden {cfg.hidden_size}, "
            f"the target has {embed.num_embeddings} / {embed.embedding_dim}"
        )
    dtype = dtype or embed.weight.dtype
    device = torch.device(device) if device is not None else embed.weight.device
    # Built without storage, then given the checkpoint's tensors already cast and placed: no fp32
    # copy on the device, nothing left behind on the CPU.
    with torch.device("meta"):
        model = build_drafter(cfg, embed, lm_head)
    state = {k: t.to(device=device, dtype=dtype) for k, t in load_file(str(weights)).items()}
    model.load_state_dict(state, strict=True, assign=True)
    return model.eval()
