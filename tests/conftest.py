"""Shared fixtures: tiny random-weight checkpoints and a tokenizer trained in-test (no trained model)."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import pytest
import torch

# Test models are tiny: one thread is fastest, and it keeps tests from fighting over the cores.
torch.set_num_threads(1)

SAMPLE_FILES = ["textwrap.py", "bisect.py", "keyword.py", "colorsys.py"]


def sample_text() -> str:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return "\n".join((stdlib / name).read_text(encoding="utf-8") for name in SAMPLE_FILES)


def train_tokenizer(vocab_size: int = 384):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", "<|mask|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator([sample_text()], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")


def build_checkpoint(directory: Path, arch: str, tokenizer, seed: int = 0, **overrides) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=512,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id,
    )
    if arch == "qwen3":
        config = Qwen3Config(**common, tie_word_embeddings=True, rope_theta=10000.0, **overrides)
        model = Qwen3ForCausalLM(config)
    else:
        config = LlamaConfig(
            **common, tie_word_embeddings=False, rope_theta=50000.0, attention_bias=True, **overrides
        )
        model = LlamaForCausalLM(config)
    # Random init at std 0.02 gives near-uniform logits; a larger scale gives peaked, model-like ones.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0, 0.25 if "embed" in name or "lm_head" in name else 0.12)
            elif "bias" in name:
                p.normal_(0, 0.05)
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="session", autouse=True)
def cost_table_cache(tmp_path_factory):
    """Engines that profile SPS(B) cache it per test session, not in the user's ~/.cache/dspark."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DSPARK_CACHE_DIR", str(tmp_path_factory.mktemp("cost_tables")))
        yield


@pytest.fixture(scope="session")
def tokenizer():
    return train_tokenizer()


@pytest.fixture(scope="session")
def qwen3_dir(tmp_path_factory, tokenizer) -> Path:
    return build_checkpoint(tmp_path_factory.mktemp("qwen3"), "qwen3", tokenizer)


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory, tokenizer) -> Path:
    return build_checkpoint(tmp_path_factory.mktemp("llama"), "llama", tokenizer)
