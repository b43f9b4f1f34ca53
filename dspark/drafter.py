"""The drafter protocol: what the engine gives a drafter and what it gets back.

In: every committed token with the target's hidden states at the drafter's chosen layers (the
context a DSpark drafter fuses), then, each round, the anchor and how many slots to fill.
Out: the proposed tokens, the draft distribution q of every slot (exactly what verification must
use) and a per-slot confidence that the token survives given its prefix did (what the scheduler
ranks by).

Dtype and device: a drafter is created with the engine's `dtype` and `device` and computes there;
its weights are cast and moved at load, its caches and index tensors live on that device (the
hidden states it receives are already there, in that dtype). What it hands back crosses to the
engine's side, which verifies on the CPU in fp32 (the runner returns the target's logits so): every
tensor of a DraftProposal is fp32 on the CPU. q must be the very distribution the token was drawn
from, so drafters sample in fp32 from fp32 logits (`dspark.sampling.sample_rows`) whatever their
weights' dtype, and move q to the CPU unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from dspark.errors import InvalidRequestError
from dspark.sampling_params import SamplingParams


@dataclass
class DraftRequest:
    seq_id: str
    token_ids: list[int]  # every committed token; the last one is the anchor x0, not yet run by the target
    num_slots: int  # propose at most this many tokens
    params: SamplingParams
    generator: torch.Generator | None  # the request's own, so a seeded request reproduces


@dataclass
class DraftProposal:
    token_ids: list[int]
    # [len(token_ids), V] fp32 on the CPU, shaped by the request's temperature/top-k/top-p; None means
    # deterministic (a one-hot q), as for n-gram lookup, or a greedy request (q is then not needed).
    probs: torch.Tensor | None = None
    # [len(token_ids)] fp32 on the CPU: estimate of P(slot accepted | previous slots accepted); None
    # when unknown.
    confidence: torch.Tensor | None = None
    # The confidence head's raw logits before calibration (fp32, CPU), for fitting and monitoring it.
    confidence_logits: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.probs is not None and self.probs.shape[0] != len(self.token_ids):
            raise ValueError("draft probs must have one row per proposed token")


@runtime_checkable
class Drafter(Protocol):
    name: str
    # Target layers whose raw outputs this drafter reads; () when it needs no hidden states.
    target_layer_ids: tuple[int, ...]
    # The most tokens one proposal can hold (the block size gamma).
    max_draft_tokens: int

    def add_context(self, seq_id: str, token_ids: list[int], hidden: torch.Tensor | None) -> None:
        """Tokens whose K/V the target just committed, with hidden [n, len(target_layer_ids) * d]."""

    def propose(self, requests: list[DraftRequest]) -> list[DraftProposal]:
        """One proposal per request, in order, each of at most `num_slots` tokens."""

    def release(self, seq_id: str) -> None:
        """The request finished or was aborted: drop its state."""


DrafterFactory = Callable[..., Drafter]
# Plugins name their drafter classes under this entry-point group (pyproject.toml):
#   [project.entry-points."dspark.drafters"]  dspark = "drafter_service.runtime.block:BlockDraftRuntime"
ENTRY_POINT_GROUP = "dspark.drafters"
# The training-free drafters ship with the engine; everything else arrives as a plugin.
_REGISTRY: dict[str, str] = {
    "none": "dspark.drafters.none:NoDrafter",
    "ngram": "dspark.drafters.ngram:NgramDrafter",
}
_plugins_loaded = False


def _load_plugins() -> None:
    """Read the installed distributions' `dspark.drafters` entry points once (import paths only:
    a plugin's module is imported when its drafter is first created, never at start-up)."""
    global _plugins_loaded
    if _plugins_loaded:
        return
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        _REGISTRY.setdefault(ep.name, ep.value)
    _plugins_loaded = True


def register_drafter(name: str, target: str) -> None:
    """Register a drafter class by import path ('package.module:Class'), imported only when used."""
    _REGISTRY[name] = target


def available_drafters() -> list[str]:
    _load_plugins()
    return sorted(_REGISTRY)


def create_drafter(name: str, **kwargs) -> Drafter:
    """Instantiate drafter `name` with the engine's keywords: `target` (the CausalLM whose embeddings
    and LM head a learned drafter shares), `num_speculative_tokens`, `path`, `target_path`, `dtype`
    (a torch.dtype) and `device`, plus the config's drafter_options. A drafter with no tensors of its
    own (none, ngram) ignores dtype and device; a learned one runs in exactly those."""
    import importlib

    _load_plugins()
    if name not in _REGISTRY:
        raise InvalidRequestError("drafter", f"unknown drafter {name!r}; available: {available_drafters()}")
    module, cls = _REGISTRY[name].split(":")
    return getattr(importlib.import_module(module), cls)(name=name, **kwargs)
