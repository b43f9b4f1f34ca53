"""Finding and opening a drafter checkpoint for a target."""

from __future__ import annotations

from pathlib import Path

from drafter_service.models.checkpoint import load_drafter
from dspark.errors import ModelLoadError


def default_drafter_dir(target_path: str | Path, name: str) -> Path:
    """`make models` lays drafters beside the target: models/target -> models/drafters/NAME."""
    return Path(target_path).parent / "drafters" / name


def open_drafter(name: str, path: str | None, target_path: str | None, target):
    directory = Path(path) if path else (default_drafter_dir(target_path, name) if target_path else None)
    if directory is None:
        raise ModelLoadError(f"drafter {name!r} needs a checkpoint directory (drafter_model)")
    try:
        model = load_drafter(directory, target.model.embed_tokens, target.lm_head)
    except (FileNotFoundError, ValueError) as exc:
        raise ModelLoadError(f"cannot load drafter {name!r}: {exc}") from exc
    if model.cfg.architecture != name:
        raise ModelLoadError(f"{directory} holds a {model.cfg.architecture!r} drafter, not {name!r}")
    return model
