"""Drafter checkpoint configuration, with DeepSpec's field names so checkpoints move between kits."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

# Architectures: the two block drafters share a backbone; the two autoregressive ones share a layer.
BLOCK_ARCHITECTURES = ("dspark", "dflash")
AR_ARCHITECTURES = ("eagle3", "mtp1")


@dataclass
class DrafterConfig:
    architecture: str  # dspark | dflash | eagle3 | mtp1
    vocab_size: int
    hidden_size: int  # equals the target's: embeddings and LM head are the target's own, frozen
    target_hidden_size: int
    target_layer_ids: list[int]
    num_draft_layers: int = 1
    num_attention_heads: int = 6
    num_key_value_heads: int = 2
    head_dim: int = 64
    intermediate_size: int = 1024
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    block_size: int = 7  # gamma: slots per block (block drafters) or chain length (autoregressive)
    mask_token_id: int | None = None
    markov_rank: int = 0  # 0: no Markov head (DFlash)
    use_confidence_head: bool = False
    ttt_steps: int = 1  # training-time test steps (EAGLE-3: 7)
    # Sequential temperature scaling of the confidence logits: per serving temperature (as a string
    # key, e.g. "1.0"), one temperature per block position. Empty: raw confidences.
    calibration_temperatures: dict[str, list[float]] = field(default_factory=dict)
    training: dict = field(default_factory=dict)  # provenance: steps, wall time, data, losses

    def __post_init__(self) -> None:
        if self.architecture not in BLOCK_ARCHITECTURES + AR_ARCHITECTURES:
            raise ValueError(f"unknown drafter architecture {self.architecture!r}")
        if self.architecture in BLOCK_ARCHITECTURES and self.mask_token_id is None:
            raise ValueError("block drafters need mask_token_id")
        if self.use_confidence_head and self.architecture not in BLOCK_ARCHITECTURES:
            raise ValueError("only block drafters have a confidence head")

    @property
    def is_block(self) -> bool:
        return self.architecture in BLOCK_ARCHITECTURES

    def save(self, directory: Path) -> None:
        (Path(directory) / "config.json").write_text(json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def load(cls, directory: Path) -> DrafterConfig:
        raw = json.loads((Path(directory) / "config.json").read_text())
        return cls.from_dict(raw)

    @classmethod
    def from_dict(cls, raw: dict) -> DrafterConfig:
        """Accepts DeepSpec's layout too: `model_type` for the architecture, unknown keys ignored."""
        raw = dict(raw)
        if "architecture" not in raw:
            raw["architecture"] = raw.pop("model_type", raw.get("drafter_type"))
        if "num_draft_layers" not in raw and "num_hidden_layers" in raw:
            raw["num_draft_layers"] = raw["num_hidden_layers"]
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in known})
