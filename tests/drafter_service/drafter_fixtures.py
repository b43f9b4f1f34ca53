"""Tiny drafters of every kind, trained in-test for a few seconds on a tiny random target's own text."""

from __future__ import annotations

from pathlib import Path

import torch

from drafter_service.models.checkpoint import save_drafter
from drafter_service.models.config import DrafterConfig
from drafter_service.training.regen import answer_prompts
from drafter_service.training.train import TrainSettings, train_drafters
from dspark import LLM

DRAFTERS = ("dspark", "dflash", "eagle3", "mtp1")


def tiny_configs(vocab: int, hidden: int, mask_token_id: int, gamma: int = 4, layers: int = 3) -> dict:
    common = dict(
        vocab_size=vocab,
        hidden_size=hidden,
        target_hidden_size=hidden,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden // 4,
        intermediate_size=2 * hidden,
        block_size=gamma,
    )
    return {
        "dspark": DrafterConfig(
            "dspark",
            target_layer_ids=[0, 1],
            mask_token_id=mask_token_id,
            markov_rank=8,
            use_confidence_head=True,
            **common,
        ),
        "dflash": DrafterConfig("dflash", target_layer_ids=[0, 1], mask_token_id=mask_token_id, **common),
        "eagle3": DrafterConfig("eagle3", target_layer_ids=[0, 1, layers - 1], ttt_steps=3, **common),
        "mtp1": DrafterConfig("mtp1", target_layer_ids=[layers - 1], **{**common, "block_size": 1}),
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
    settings = TrainSettings(steps=steps, batch_size=4, anchors_per_seq=8, positions_per_seq=16)
    models = train_drafters(str(target_dir), configs, data, settings, pad_id=pad_id)
    for name, model in models.items():
        save_drafter(model, target_dir.parent / "drafters" / name)
    return models
