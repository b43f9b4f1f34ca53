"""EngineConfig: everything that shapes one engine instance, validated once at construction."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from dspark.errors import InvalidRequestError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class EngineConfig:
    model: str
    drafter: str = "none"
    # Block size gamma: the most tokens drafted per request per round (vLLM: num_speculative_tokens).
    num_speculative_tokens: int = 5
    drafter_model: str | None = None  # checkpoint directory of a learned drafter
    drafter_options: dict = field(default_factory=dict)
    dtype: str = "float32"
    device: str = "cpu"
    block_size: int = 16
    num_kv_blocks: int | None = None  # default: as many as kv_cache_memory_mb holds
    kv_cache_memory_mb: int = 512
    max_num_seqs: int = 64
    # Tokens per forward across the batch; long prompts are prefilled in chunks of what is left.
    max_num_batched_tokens: int = 1024
    max_model_len: int | None = None  # default: the model's max_position_embeddings
    seed: int = 0

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise InvalidRequestError("dtype", f"unknown dtype {self.dtype!r}; choose from {sorted(DTYPES)}")
        for name in ("num_speculative_tokens",):
            if getattr(self, name) < 0:
                raise InvalidRequestError(name, "must be >= 0")
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens", "kv_cache_memory_mb"):
            if getattr(self, name) <= 0:
                raise InvalidRequestError(name, "must be >= 1")
        if self.max_num_batched_tokens < self.max_num_seqs * (self.num_speculative_tokens + 1):
            # Every running request must be able to verify at least its anchor each step.
            object.__setattr__(
                self, "max_num_batched_tokens", self.max_num_seqs * (self.num_speculative_tokens + 1)
            )

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]
