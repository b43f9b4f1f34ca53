"""Drafter checkpoints in DeepSpec's layout: what DeepSpec's `save_pretrained` writes, and what its
`from_pretrained` and SGLang's DSpark loader read.

A drafter directory holds `config.json` (config.py), `model.safetensors` with DeepSpec's tensor names,
embed_tokens / lm_head included (copies of the target's, as DeepSpec stores them), and our extras
(extras.py). Loading shares the target's embeddings and LM head instead of the copies, after checking
the copies are the target's. Checkpoints of this project's previous layout are converted on the fly
(legacy.py). Only safetensors are read, so nothing is ever unpickled.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import nn

from drafter_service.models import legacy
from drafter_service.models.config import DrafterConfig
from drafter_service.models.extras import load_extras, save_extras
from dspark.checkpoint import ModelConfig
from dspark.errors import ModelLoadError

SHARED = {"embed_tokens.weight": 0, "lm_head.weight": 1}  # the target's, by position in model.shared
# Rows of the stored embedding / LM head compared with the target's: enough to tell another target apart.
CHECKED_ROWS = 8


def build_drafter(cfg: DrafterConfig, embed: nn.Embedding, lm_head: nn.Linear) -> nn.Module:
    from drafter_service.models.autoregressive import ARDrafter
    from drafter_service.models.block import BlockDrafter

    return (BlockDrafter if cfg.is_block else ARDrafter)(cfg, embed, lm_head)


def save_drafter(model: nn.Module, directory: str | Path) -> None:
    """Write `model` as DeepSpec would: config.json, model.safetensors (with the shared copies), extras."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    dtype = model.dtype
    for name, index in SHARED.items():  # clone: a tied target's two are one tensor
        tensors[name] = model.shared[index].weight.detach().to(dtype).clone().contiguous()
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    cfg = model.cfg
    config = cfg.to_config_json(str(dtype).removeprefix("torch."))
    (directory / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    save_extras(directory, cfg.kind, cfg.training, cfg.sts_temperatures)


def read_config(directory: str | Path, target: ModelConfig | None = None) -> DrafterConfig:
    """The drafter's config (with our extras), either layout; `target` is needed for the old one."""
    return _config_and_names(Path(directory), target)[0]


def _config_and_names(
    directory: Path, target: ModelConfig | None
) -> tuple[DrafterConfig, Callable[[str], str]]:
    """The config, and how the checkpoint's tensor names map to ours (as they are, or the old layout's)."""
    raw = _read_json(directory / "config.json")
    if legacy.is_legacy(raw):
        if target is None:
            raise ModelLoadError(f"{directory} is in the previous layout: reading it needs the target")
        return legacy.convert_config(raw, target.num_layers, target.max_position_embeddings), legacy.rename
    kind, training, sts = load_extras(directory)
    cfg = DrafterConfig.from_config_json(raw, kind)
    cfg.training, cfg.sts_temperatures = training, sts
    return cfg, lambda name: name


def load_drafter(
    directory: str | Path,
    embed: nn.Embedding,
    lm_head: nn.Linear,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
    target: ModelConfig | None = None,
) -> nn.Module:
    """Load a drafter beside its target (`target`: its config, checked against the drafter's), its
    weights cast to `dtype` on `device` (default: those of the target's embeddings, which the drafter
    shares and must compute with). Every fault is a ModelLoadError naming what is wrong."""
    directory = Path(directory)
    if not (directory / "config.json").is_file():
        raise ModelLoadError(f"drafter directory {str(directory)!r} has no config.json")
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(
            f"drafter directory {str(directory)!r} has no *.safetensors weights (safetensors only)"
        )
    try:
        cfg, rename = _config_and_names(directory, target)
    except ModelLoadError as exc:
        raise ModelLoadError(f"drafter {directory}: {exc}") from None
    _check_target(cfg, embed, target, directory)
    dtype = dtype or embed.weight.dtype
    device = torch.device(device) if device is not None else embed.weight.device
    # Built without storage, then given the checkpoint's tensors already cast and placed: no fp32
    # copy on the device, nothing left behind on the CPU.
    try:
        with torch.device("meta"):
            model = build_drafter(cfg, embed, lm_head)
    except ModelLoadError as exc:  # what only building shows (the RoPE tables)
        raise ModelLoadError(f"drafter {directory}: {exc}") from None
    state = {}
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():
                    if name in SHARED:
                        _check_shared(name, f.get_slice(name), model.shared[SHARED[name]].weight, directory)
                    else:
                        state[rename(name)] = f.get_tensor(name)
        except SafetensorError as exc:
            raise ModelLoadError(f"drafter {directory}: cannot read {file.name}: {exc}") from None
    _check_names_and_shapes(model, state, directory)
    model.load_state_dict(
        {k: t.to(device=device, dtype=dtype) for k, t in state.items()}, strict=True, assign=True
    )
    model.rotary_emb.to(device)  # fp32 tables, not in the state dict
    return model.eval()


def _read_json(path: Path) -> dict:
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ModelLoadError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ModelLoadError(f"{path} is not a JSON object")
    return raw


def _check_target(
    cfg: DrafterConfig, embed: nn.Embedding, target: ModelConfig | None, directory: Path
) -> None:
    if cfg.vocab_size != embed.num_embeddings or cfg.hidden_size != embed.embedding_dim:
        raise ModelLoadError(
            f"drafter {directory} was trained for vocab {cfg.vocab_size} / hidden {cfg.hidden_size}, "
            f"the target has {embed.num_embeddings} / {embed.embedding_dim}"
        )
    if target is not None and cfg.num_target_layers != target.num_layers:
        raise ModelLoadError(
            f"drafter {directory} was trained for a target of {cfg.num_target_layers} layers "
            f"(num_target_layers), this target has {target.num_layers}"
        )


def _check_shared(name: str, lazy, shared: torch.Tensor, directory: Path) -> None:
    """The stored copy must be the target's own (up to the rounding of a cast between dtypes)."""
    shape = tuple(lazy.get_shape())
    if shape != tuple(shared.shape):
        raise ModelLoadError(
            f"drafter {directory}: {name} has shape {shape}, the target's is {tuple(shared.shape)}"
        )
    n = shape[0]
    rows = sorted({int(i) for i in torch.linspace(0, n - 1, CHECKED_ROWS)})
    stored = torch.stack([lazy[i : i + 1][0] for i in rows]).float()
    own = shared.detach()[rows].float().cpu()
    if not torch.allclose(stored, own, rtol=2**-7, atol=2**-14):
        raise ModelLoadError(
            f"drafter {directory}: its {name} is not the target's: it was trained for another target"
        )


def _check_names_and_shapes(model: nn.Module, state: dict[str, torch.Tensor], directory: Path) -> None:
    expected = model.state_dict()
    missing, unexpected = sorted(expected.keys() - state.keys()), sorted(state.keys() - expected.keys())
    if missing or unexpected:
        raise ModelLoadError(
            f"drafter {directory}: weights do not match config.json: missing {missing[:6]}, "
            f"unexpected {unexpected[:6]}"
        )
    for name, tensor in state.items():
        if tuple(tensor.shape) != tuple(expected[name].shape):
            raise ModelLoadError(
                f"drafter {directory}: {name} has shape {tuple(tensor.shape)}, "
                f"config.json says {tuple(expected[name].shape)}"
            )
