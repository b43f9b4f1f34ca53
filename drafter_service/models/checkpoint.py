"""Drafter checkpoints: `model.safetensors` + DeepSpec-style `config.json` (calibration included).

The target's embeddings and LM head are not stored: a drafter is always loaded beside its target and
takes them from it. Only safetensors are read, so nothing is ever unpickled.
"""

from __future__ import annotations

from pathlib import Path

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


def load_drafter(directory: str | Path, embed: nn.Embedding, lm_head: nn.Linear) -> nn.Module:
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
    model = build_drafter(cfg, embed, lm_head)
    model.load_state_dict(load_file(str(weights)), strict=True)
    return model.eval()
