"""EngineConfig: everything that shapes one engine instance, validated once at construction."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from dspark.draft_budget import DraftBudget
from dspark.errors import InvalidRequestError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# How many drafted tokens are verified (docs/ALGORITHM.md §7-§8): dspark = Algorithm 1 with the early stop,
# pipelined = capacity from two rounds back; baselines: fixed gamma, static confidence threshold,
# mtp1 (one drafted token, verify window 2), plain (no drafting).
SCHEDULERS = ("dspark", "pipelined", "fixed", "threshold", "mtp1", "plain")


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
    kv_page_size: int = 16  # tokens per KV cache page (the drafter's block is num_speculative_tokens)
    num_kv_pages: int | None = None  # default: as many as kv_cache_memory_mb holds
    kv_cache_memory_mb: int = 512
    max_num_seqs: int = 64
    # Tokens per forward across the batch; long prompts are prefilled in chunks of what is left.
    max_num_batched_tokens: int = 1024
    max_model_len: int | None = None  # default: the model's max_position_embeddings
    # Reuse the K/V of full prompt pages between requests whose prompts start alike (dspark/prefix_cache.py).
    # On by default, as in vLLM v1: reuse is exact (pages are matched on their tokens, never written
    # while shared), so output is unchanged and only repeated prefill is saved. Cached pages carry
    # the hidden states a learned drafter reads (its tapped layers' width per token, in host memory).
    enable_prefix_caching: bool = True
    seed: int = 0
    scheduler: str = "dspark"
    confidence_threshold: float = 0.5  # threshold mode: verify drafts whose prefix survival reaches it
    draft_budget: DraftBudget = field(default_factory=DraftBudget)  # at start; Engine.set_draft_budget
    cost_table_dir: str | None = None  # SPS cache; default $DSPARK_CACHE_DIR or ~/.cache/dspark
    cost_table_profile: str = "full"  # or "coarse": fewer points, for tiny models and tests
    # Scheduled modes skip drafting for rounds where earlier rounds say the drafter's own cost outweighs
    # its accepted tokens (draft_gate.py); False drafts every round, as Algorithm 1 alone does.
    draft_gate: bool = True
    # Scheduled modes walk Algorithm 1 on each round's forward plus its drafting (the gate's measured
    # drafting seconds per request: scheduler.RoundRate) instead of the forward alone. Off by default (the
    # paper's Algorithm 1, which the simulator models): on this project's CPU, single stream, it verified
    # 4.15 drafts a round instead of 3.29 at T=0 (1.98x plain against 1.86x, noise 2.9 %) and gained
    # nothing at T=1 (0.95x against 1.00x, noise 7.8 %), where the gate declines most rounds either way
    # (python bench/round_rate.py); at higher concurrency not measured yet.
    verify_counts_drafting: bool = False
    cost_table_ema: float = 0.05  # weight of each observed step in the table's online refresh; 0 freezes
    # Isolation (request_failure.py, drafter_guard.py): a request whose own processing raises fails
    # alone, but this many such failures within `failure_window_steps` steps mark the engine unhealthy.
    max_request_failures: int = 5
    failure_window_steps: int = 200
    # A request the drafter failed this many times decodes without drafts to its end.
    max_drafter_failures: int = 3

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise InvalidRequestError("dtype", f"unknown dtype {self.dtype!r}; choose from {sorted(DTYPES)}")
        if self.scheduler not in SCHEDULERS:
            raise InvalidRequestError(
                "scheduler", f"unknown mode {self.scheduler!r}; choose from {list(SCHEDULERS)}"
            )
        if self.cost_table_profile not in ("full", "coarse"):
            raise InvalidRequestError("cost_table_profile", "must be 'full' or 'coarse'")
        for name in ("confidence_threshold", "cost_table_ema"):
            if not 0 <= getattr(self, name) <= 1:
                raise InvalidRequestError(name, "must be in [0, 1]")
        if not isinstance(self.draft_budget, DraftBudget):
            raise InvalidRequestError("draft_budget", "must be a DraftBudget")
        for name in ("num_speculative_tokens",):
            if getattr(self, name) < 0:
                raise InvalidRequestError(name, "must be >= 0")
        for name in (
            "kv_page_size",
            "max_num_seqs",
            "max_num_batched_tokens",
            "kv_cache_memory_mb",
            "max_request_failures",
            "failure_window_steps",
            "max_drafter_failures",
        ):
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
