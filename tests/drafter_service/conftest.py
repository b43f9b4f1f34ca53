"""Shared fixtures: a small tokenizer trained on a slice of the real corpus, and the tiny drafter stack."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from drafter_fixtures import tiny_configs, train_tiny_stack
from transformers import PreTrainedTokenizerFast

from drafter_service.demo import corpus
from drafter_service.demo.tokenizer import train_tokenizer


@pytest.fixture(autouse=True, scope="session")
def _one_thread() -> None:
    # The tests share a small machine; one thread keeps timings predictable.
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def small_texts() -> list[str]:
    """A deterministic slice of the training corpus: both domains, about 300 KB."""
    code = corpus.documents("code", "train")[:40]
    prose = corpus.documents("prose", "train")[:40]
    return code + prose


@pytest.fixture(scope="session")
def small_tokenizer(small_texts: list[str]) -> PreTrainedTokenizerFast:
    return train_tokenizer(small_texts, vocab_size=512)


@pytest.fixture(scope="session")
def stack(tmp_path_factory, qwen3_dir, tokenizer) -> Path:
    """The tiny random target with every learned drafter trained on its own text (a few seconds)."""
    target = tmp_path_factory.mktemp("stack") / "target"
    shutil.copytree(qwen3_dir, target)
    configs = tiny_configs(target, tokenizer.convert_tokens_to_ids("<|mask|>"))
    train_tiny_stack(target, configs, len(tokenizer), tokenizer.eos_token_id)
    return target
