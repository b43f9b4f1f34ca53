"""Greedy output is token-identical to plain decoding for every drafter, batched and staggered."""

from __future__ import annotations

import pytest
import torch
from test_drafters import AdversarialDrafter, ScriptedDrafter

from dspark import SamplingParams
from dspark.config import EngineConfig
from dspark.engine import Engine

GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


def prompts_of_mixed_length(vocab: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(7)
    lengths = [3, 70, 11, 1, 40, 25]  # 70 and 40 are prefilled in chunks (budget 36 tokens per step)
    # Repeated spans give the n-gram drafter something to find.
    return [(torch.randint(0, vocab, (max(1, n // 2),), generator=gen).tolist() * 2)[:n] for n in lengths]


def run_staggered(engine: Engine, prompts) -> list[list[int]]:
    """Requests arrive two steps apart, joining a batch that is already decoding."""
    results: dict[str, list[int]] = {}
    arrivals = list(enumerate(prompts))
    step = 0
    while arrivals or engine.has_unfinished():
        if arrivals and step % 2 == 0:
            i, p = arrivals.pop(0)
            engine.add_request(p, GREEDY, request_id=str(i))
        for out in engine.step():
            if out.finished:
                results[out.request_id] = out.token_ids
        step += 1
    return [results[str(i)] for i in range(len(prompts))]


_REFERENCE: dict[str, list[list[int]]] = {}


def reference(model_dir, prompts) -> list[list[int]]:
    """Each prompt decoded alone with no drafter and no prefix cache: what every other configuration
    must reproduce."""
    if str(model_dir) in _REFERENCE:
        return _REFERENCE[str(model_dir)]
    outs = []
    engine = Engine(
        EngineConfig(
            model=str(model_dir), drafter="none", max_num_seqs=1, num_kv_pages=32, enable_prefix_caching=False
        )
    )
    for p in prompts:
        rid = engine.add_request(p, GREEDY)
        final = None
        while engine.has_unfinished():
            for out in engine.step():
                if out.request_id == rid and out.finished:
                    final = out.token_ids
        outs.append(final)
    _REFERENCE[str(model_dir)] = outs
    return outs


@pytest.fixture(params=["qwen3", "llama"])
def model_dir(request, qwen3_dir, llama_dir):
    return qwen3_dir if request.param == "qwen3" else llama_dir


def small_batch_config(model_dir, drafter: str = "none") -> EngineConfig:
    return EngineConfig(
        model=str(model_dir),
        drafter=drafter,
        num_speculative_tokens=4,
        max_num_seqs=6,
        max_num_batched_tokens=36,
        kv_page_size=8,
        num_kv_pages=96,
    )


@pytest.mark.parametrize("drafter", ["none", "ngram", "scripted", "adversarial"])
def test_greedy_identical_to_plain_decoding(model_dir, drafter):
    engine = Engine(small_batch_config(model_dir))
    prompts = prompts_of_mixed_length(engine.model_config.vocab_size)
    expected = reference(model_dir, prompts)
    if drafter == "scripted":
        engine.drafter = ScriptedDrafter({tuple(p): e for p, e in zip(prompts, expected)}, gamma=4)
    elif drafter == "adversarial":
        engine.drafter = AdversarialDrafter(torch.randn(engine.model_config.vocab_size), gamma=4)
    elif drafter == "ngram":
        engine = Engine(small_batch_config(model_dir, "ngram"))
    engine.gamma = min(4, engine.drafter.max_draft_tokens)
    engine.policy.gamma = engine.gamma

    assert run_staggered(engine, prompts) == expected
    stats = engine.stats
    assert stats.generated_tokens == sum(len(e) for e in expected)
    if drafter in ("ngram", "scripted"):
        assert stats.accepted_tokens > 0  # speculation really happened
    if drafter == "scripted":
        assert stats.accepted_tokens < stats.drafted_tokens  # and rejections were rolled back
        assert stats.mean_accept_length > 2
    assert engine.pages.num_free_pages == engine.pages.num_pages  # every block came back
