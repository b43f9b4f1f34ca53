"""Shared fixtures: a small tokenizer trained on a slice of the real corpus, built once per session."""

from __future__ import annotations

import pytest
import torch
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
