"""Finding and opening a drafter checkpoint for a target, in the engine's dtype on its device."""

from __future__ import annotations

from pathlib import Path

import torch

from drafter_service.models.checkpoint import load_drafter
from dspark.errors import ModelLoadError


def default_drafter_dir(target_path: str | Path, name: str) -> Path:
    """`make models` lays drafters beside the target: models/target -> models/drafters/NAME."""
    return Path(target_path).parent / "drafters" / name


def open_drafter(
    name: str,
    path: str | None,
    target_path: str | None,
    target,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
):
    """Load drafter `name` for `target`; dtype and device default to the target's own."""
    directory = Path(path) if path else (default_drafter_dir(target_path, name) if target_path else None)
    if directory is None:
        raise ModelLoadError(f"drafter {name!r} needs a checkpoint directory (drafter_model)")
    embed = target.model.embed_tokens
    shared = embed.weight
    dtype = dtype or shared.dtype
    device = torch.device(device) if device is not None else shared.device
    # The drafter computes with the target's embeddings and LM head as they are; a drafter placed
    # elsewhere would fail at its first step (or silently run on the wrong device): refuse it here.
    if shared.dtype != dtype or not _same_device(shared.device, device):
        raise ModelLoadError(
            f"drafter {name!r} was asked for {dtype} on {device}, but the target's embeddings it "
            f"shares are {shared.dtype} on {shared.device}"
        )
    try:
        model = load_drafter(directory, embed, target.lm_head, dtype, shared.device, target.config)
    except (ModelLoadError, OSError) as exc:
        raise ModelLoadError(f"cannot load drafter {name!r}: {exc}") from exc
    if model.cfg.kind != name:
        raise ModelLoadError(f"{directory} holds a {model.cfg.kind!r} drafter, not {name!r}")
    return model


def _same_device(actual: torch.device, wanted: torch.device) -> bool:
    """'cuda' names whichever GPU is current, so it matches the target's 'cuda:N'."""
    return actual.type == wanted.type and (wanted.index is None or actual.index == wanted.index)
