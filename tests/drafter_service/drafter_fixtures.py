"""Tiny drafters of every kind, trained in-test for a few seconds on a tiny random target's own text."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoConfig

from drafter_service.models.checkpoint import save_drafter
from drafter_service.models.config import DrafterConfig
from drafter_service.training.regen import answer_prompts
from drafter_service.training.train import TrainSettings, train_drafters
from dspark import LLM

DRAFTERS = ("dspark", "dflash", "eagle3", "mtp1")


def tiny_configs(target_dir: Path, mask_token_id: int, gamma: int = 4) -> dict:
    """One drafter of each kind for the target in `target_dir`, its shape copied as DeepSpec copies it."""
    t = AutoConfig.from_pretrained(target_dir)
    last = t.num_hidden_layers - 1
    block = dict(target_layer_ids=[0, 1], mask_token_id=mask_token_id, block_size=gamma, num_anchors=8)
    return {
        "dspark": DrafterConfig.for_target(
            t,
            "dspark",
            markov_rank=8,
            markov_head_type="vanilla",
            enable_confidence_head=True,
            confidence_head_with_markov=True,
            **block,
        ),
        "dflash": DrafterConfig.for_target(t, "dflash", **block),
        "eagle3": DrafterConfig.for_target(t, "eagle3", target_layer_ids=sorted({0, 1, last}), ttt_length=3),
        "mtp1": DrafterConfig.for_target(t, "mtp1", target_layer_ids=[last], ttt_length=1),
    }


def train_tiny_stack(
    target_dir: Path,
    configs: dict,
    vocab: int,
    pad_id: int,
    steps: int = 40,
    prompt_len: int = 12,
    answer_len: int = 24,
    num_prompts: int = 24,
) -> dict:
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(2, vocab, (prompt_len,), generator=gen).tolist() for _ in range(num_prompts)]
    data = answer_prompts(
        LLM(str(target_dir), num_kv_pages=256, kv_page_size=8), prompts, ["code"] * len(prompts), answer_len
    )
    settings = TrainSettings(steps=steps, batch_size=4, positions_per_seq=16)
    models = train_drafters(str(target_dir), configs, data, settings, pad_id=pad_id)
    for name, model in models.items():
        save_drafter(model, target_dir.parent / "drafters" / name)
    return models


def save_untrained_dspark(target_dir: Path, directory: Path, gamma: int = 4, **fields) -> Path:
    """A DSpark drafter with random weights for the target in `target_dir`, saved in DeepSpec's layout:
    for loaders and launchers, which read its files, not for acceptance."""
    from drafter_service.models.checkpoint import build_drafter
    from dspark.checkpoint import load_checkpoint
    from dspark.model import CausalLM

    target = CausalLM.from_checkpoint(load_checkpoint(target_dir, load_tokenizer=False))
    t = AutoConfig.from_pretrained(target_dir)
    args = dict(target_layer_ids=[0, 1], mask_token_id=1, block_size=gamma, num_anchors=8, markov_rank=8,
                markov_head_type="vanilla", enable_confidence_head=True,
                confidence_head_with_markov=True)  # fmt: skip
    cfg = DrafterConfig.for_target(t, "dspark", **(args | fields))
    save_drafter(build_drafter(cfg, target.model.embed_tokens, target.lm_head), directory)
    return directory
