"""Every learned drafter runs inside the engine: greedy output stays token-identical to plain decoding."""

from __future__ import annotations

import pytest
import torch
from drafter_fixtures import DRAFTERS

from dspark import LLM, ModelLoadError, SamplingParams

PROMPTS = ["def parse(text):\n    return", "import os\n", "The value of", "x = 1"]
GREEDY = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)


def fixed_block(stack, drafter: str, **options) -> LLM:
    """A fixed verify length, so every round verifies drafts: the load-aware schedulers gate drafting
    off when the measured step times say it does not pay (a loaded machine: 0 drafted tokens)."""
    return LLM(
        str(stack),
        drafter=drafter,
        scheduler="fixed",
        num_speculative_tokens=4,
        num_kv_pages=64,
        max_num_seqs=4,
        **options,
    )


@pytest.mark.parametrize("drafter", DRAFTERS)
def test_greedy_identical_with_every_drafter(stack, drafter):
    expected = LLM(str(stack), num_kv_pages=64).generate(PROMPTS, GREEDY)
    llm = fixed_block(stack, drafter)
    outs = llm.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in outs] == [e.token_ids for e in expected]
    stats = llm.engine.stats
    assert stats.drafted_tokens > 0
    assert stats.drafted_tokens <= stats.rounds * (1 if drafter == "mtp1" else 4)


@pytest.mark.parametrize("drafter", ["dspark", "dflash"])
@pytest.mark.parametrize("compute_dtype", ["float32", "bfloat16"])
def test_greedy_identical_with_a_block_drafter_computing_in_either_dtype(stack, drafter, compute_dtype):
    """An fp32 target with its block drafter's layers in bf16 (the default where bf16 is native):
    the drafter's rounding moves its proposals, never the output."""
    expected = LLM(str(stack), num_kv_pages=64).generate(PROMPTS, GREEDY)
    llm = fixed_block(
        stack, drafter, drafter_options={"compute_dtype": compute_dtype, "head_dtype": compute_dtype}
    )
    assert llm.engine.drafter.model.dtype == getattr(torch, compute_dtype)
    assert llm.engine.drafter.model.rotary_emb.inv_freq.dtype == torch.float32
    assert llm.engine.model.model.embed_tokens.weight.dtype == torch.float32  # shared, left as it is
    outs = llm.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in outs] == [e.token_ids for e in expected]
    assert llm.engine.stats.accepted_tokens > 0


def test_sampled_with_every_drafter_is_seeded_and_reproducible(stack):
    params = SamplingParams(temperature=0.9, top_p=0.95, max_tokens=20, ignore_eos=True, seed=7)
    # A fixed verify length: the load-aware schedulers' choices depend on measured step times, and
    # with them how many random draws a round consumes (the distribution is exact either way).
    for drafter in DRAFTERS:
        runs = [
            LLM(
                str(stack), drafter=drafter, scheduler="fixed", num_speculative_tokens=4, num_kv_pages=64
            ).generate(PROMPTS[:2], params)
            for _ in range(2)
        ]
        assert [o.token_ids for o in runs[0]] == [o.token_ids for o in runs[1]]


def test_dspark_reports_calibrated_confidences(stack):
    llm = LLM(str(stack), drafter="dspark", num_speculative_tokens=4, num_kv_pages=64)
    seen = []
    llm.engine.round_observers.append(lambda seq, proposal, n, verdict: seen.append(proposal))
    llm.generate(PROMPTS[:1], SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True, seed=1))
    full = [p for p in seen if len(p.token_ids) == 4]
    assert full and all(p.confidence.shape == (4,) and p.confidence_logits.shape == (4,) for p in full)
    assert all(((p.confidence > 0) & (p.confidence < 1)).all() for p in full)


def test_missing_or_mismatched_drafter_checkpoint(stack, tmp_path):
    with pytest.raises(ModelLoadError, match="has no config.json"):
        LLM(str(stack), drafter="dspark", drafter_model=str(tmp_path))
    with pytest.raises(ModelLoadError, match="holds a 'dflash' drafter, not 'dspark'"):
        LLM(str(stack), drafter="dspark", drafter_model=str(stack.parent / "drafters" / "dflash"))


@pytest.mark.parametrize("drafter", ["dspark", "eagle3"])
def test_greedy_identical_with_prefix_caching(stack, drafter):
    """A learned drafter reads the target's hidden states of every committed token: for a cached
    prefix they come from the cache, and it drafts exactly as it does from computed ones."""
    system = (
        "def wrap(text, width=70, **kwargs):\n"
        "    w = TextWrapper(width=width, **kwargs)\n"
        "    return w.wrap(text)\n"
    )
    prompts = [system + p for p in PROMPTS]
    expected = LLM(str(stack), num_kv_pages=64, enable_prefix_caching=False).generate(prompts, GREEDY)
    runs = {}
    for caching in (False, True):
        # A fixed verify length: the load-aware schedulers' choices depend on measured step times.
        llm = LLM(
            str(stack),
            drafter=drafter,
            scheduler="fixed",
            num_speculative_tokens=4,
            num_kv_pages=64,
            max_num_seqs=4,
            enable_prefix_caching=caching,
        )
        # The first request fills the cache; the others arrive after it and reuse the system prompt.
        outs = llm.generate(prompts[:1], GREEDY) + llm.generate(prompts[1:], GREEDY)
        assert [o.token_ids for o in outs] == [e.token_ids for e in expected]
        runs[caching] = llm.engine.stats, [o.num_cached_tokens for o in outs]
        assert llm.engine.pages.num_free_pages == llm.engine.pages.num_pages
    (off, cached_off), (on, cached_on) = runs[False], runs[True]
    page = 16
    assert cached_off == [0] * 4 and cached_on[0] == 0 and all(n >= page for n in cached_on[1:])
    assert on.prefill_tokens == off.prefill_tokens - sum(cached_on)
    # The same context gives the same drafts: as many drafted and accepted, and no drafter fault.
    assert (on.drafted_tokens, on.accepted_tokens) == (off.drafted_tokens, off.accepted_tokens)
    assert on.drafter_failures == off.drafter_failures == 0
