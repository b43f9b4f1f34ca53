"""The runner's logits equal transformers' own model on the same checkpoint (fp32, 1e-4)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from dspark.checkpoint import load_checkpoint
from dspark.kv_cache import KVCache, PageManager
from dspark.model import CausalLM
from dspark.runner import ForwardItem, ModelRunner

BLOCK = 8


def make_runner(path):
    ckpt = load_checkpoint(path)
    model = CausalLM.from_checkpoint(ckpt)
    cfg = ckpt.config
    kv = KVCache(cfg.num_layers, 64, BLOCK, cfg.num_kv_heads, cfg.head_dim, torch.float32)
    return ModelRunner(model, kv, BLOCK), PageManager(64, BLOCK), cfg


@pytest.fixture(params=["qwen3", "llama"])
def checkpoint(request, qwen3_dir, llama_dir):
    return qwen3_dir if request.param == "qwen3" else llama_dir


@torch.no_grad()
def test_prefill_and_multi_token_steps_match_transformers(checkpoint):
    reference = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    runner, blocks, cfg = make_runner(checkpoint)
    gen = torch.Generator().manual_seed(1)
    # Three sequences with different cache lengths, run together in one flattened batch each step.
    lengths = [int(x) for x in torch.randint(5, 60, (3,), generator=gen)]
    seqs = [torch.randint(0, cfg.vocab_size, (n + 40,), generator=gen).tolist() for n in lengths]
    for i in range(len(lengths)):
        blocks.reserve(str(i), len(seqs[i]))
    done = [0, 0, 0]
    steps = [lengths] + [[int(x) for x in torch.randint(1, 8, (3,), generator=gen)] for _ in range(4)]
    for step in steps:
        items = []
        for i, n in enumerate(step):
            table = blocks.ensure(str(i), done[i] + n)
            items.append(ForwardItem(seqs[i][done[i] : done[i] + n], done[i], table, logits_from=0))
        result = runner.forward(items)
        for i, n in enumerate(step):
            full = torch.tensor([seqs[i][: done[i] + n]])
            expected = reference(full).logits[0, done[i] :]
            torch.testing.assert_close(result.logits[i], expected, atol=1e-4, rtol=0)
            done[i] += n


@torch.no_grad()
def test_taps_are_raw_layer_outputs(checkpoint):
    reference = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    runner, blocks, cfg = make_runner(checkpoint)
    tokens = list(range(3, 23))
    blocks.reserve("a", len(tokens))
    item = ForwardItem(tokens, 0, blocks.ensure("a", len(tokens)), logits_from=len(tokens) - 1)
    result = runner.forward([item], tap_layers=(0, 1))
    states = reference(torch.tensor([tokens]), output_hidden_states=True).hidden_states
    # hidden_states[i + 1] is the output of decoder layer i (the last one is normalised, so not tapped).
    expected = torch.cat([states[1][0], states[2][0]], dim=-1)
    torch.testing.assert_close(result.hidden[0], expected, atol=1e-4, rtol=0)
    assert result.logits[0].shape == (1, cfg.vocab_size)


@torch.no_grad()
def test_tap_minus_one_is_the_embedding_output(checkpoint):
    """DeepSpec's layer id -1: the embedding output (hidden_states[0]), in the order asked for."""
    reference = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    runner, blocks, _ = make_runner(checkpoint)
    tokens = list(range(3, 15))
    blocks.reserve("a", len(tokens))
    item = ForwardItem(tokens, 0, blocks.ensure("a", len(tokens)), logits_from=len(tokens) - 1)
    result = runner.forward([item], tap_layers=(-1, 1))
    states = reference(torch.tensor([tokens]), output_hidden_states=True).hidden_states
    torch.testing.assert_close(
        result.hidden[0], torch.cat([states[0][0], states[2][0]], -1), atol=1e-5, rtol=0
    )
