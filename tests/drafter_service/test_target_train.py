from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from drafter_service.demo.target import TargetShape, TrainConfig, lr_at, pack, train_target

TINY = TargetShape(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=32,
    intermediate_size=128,
    max_position_embeddings=256,
)
CFG = TrainConfig(steps=40, batch_size=4, seq_len=64, lr=1e-2, warmup_steps=3, bf16=False, eval_tokens=512)


@pytest.fixture(scope="module")
def trained(small_tokenizer, small_texts, tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("target")
    heldout = {"code": small_texts[:2], "prose": small_texts[-2:]}
    report = train_target(small_tokenizer, small_texts, heldout, out, TINY, CFG, progress=False)
    return out, report


def test_loss_goes_down(trained) -> None:
    _, report = trained
    losses = report["losses"]
    assert len(losses) == CFG.steps
    # From ln(512) = 6.2 (uniform) to below the unigram plateau of this tiny corpus.
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.5
    assert set(report["heldout_perplexity"]) == {"code", "prose"}


def test_saved_directory_loads_without_pickle(trained, small_tokenizer) -> None:
    out, report = trained
    names = {p.name for p in out.iterdir()}
    assert {"model.safetensors", "config.json", "training.json", "tokenizer.json"} <= names
    assert not {n for n in names if n.endswith((".bin", ".pt", ".pth", ".pkl", ".ckpt"))}
    model = AutoModelForCausalLM.from_pretrained(out)
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert model.dtype == torch.float32 and model.config.tie_word_embeddings
    assert model.config.num_key_value_heads < model.config.num_attention_heads
    assert model.config.vocab_size == len(small_tokenizer)
    assert sum(p.numel() for p in model.parameters()) == report["parameters"]
    assert json.loads((out / "training.json").read_text())["steps_done"] == CFG.steps
    ids = torch.tensor([small_tokenizer("def f(x):")["input_ids"]])
    assert model(ids).logits.shape == (1, ids.shape[1], len(small_tokenizer))


def test_training_is_reproducible(trained, small_tokenizer, small_texts, tmp_path: Path) -> None:
    out, _ = trained
    cfg = TrainConfig(**{**CFG.__dict__, "steps": 5})
    first = train_target(small_tokenizer, small_texts, {}, tmp_path / "a", TINY, cfg, progress=False)
    second = train_target(small_tokenizer, small_texts, {}, tmp_path / "b", TINY, cfg, progress=False)
    assert first["losses"] == second["losses"]
    a, b = load_file(tmp_path / "a" / "model.safetensors"), load_file(tmp_path / "b" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_pack_and_schedule() -> None:
    docs = [torch.arange(1, 6).numpy(), torch.arange(10, 13).numpy()]
    rows = pack(docs, eos_id=0, seq_len=3, seed=None)
    assert rows.tolist() == [[1, 2, 3], [4, 5, 0], [10, 11, 12]]
    cfg = TrainConfig(steps=100, warmup_steps=10, lr=1.0, min_lr_ratio=0.1)
    assert lr_at(0, cfg) == pytest.approx(0.1) and lr_at(9, cfg) == pytest.approx(1.0)
    assert lr_at(99, cfg) == pytest.approx(0.1, abs=1e-3)
