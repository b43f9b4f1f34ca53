"""Every drafter runs in the engine's dtype: bf16 engines with each learned drafter and n-gram.

fp32 identity is exact (test_drafters_engine.py). Here the engine runs in bf16 on the CPU, and greedy
output must equal the bf16 target alone up to the first position where the target's own top-2
logits are a near-tie bf16 rounding can flip (tests/greedy_match.py states and justifies the rule:
the diverging tokens are the plain target's top two, their gap at most 8 bf16 rounding units of the
top logit, and at most a quarter of the prompts diverge at all).
"""

from __future__ import annotations

import pytest
import torch
from drafter_fixtures import DRAFTERS
from greedy_match import PlainTarget, check, divergences

from dspark import LLM, ModelLoadError, SamplingParams
from dspark.drafter import create_drafter

GREEDY = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
NUM_PROMPTS = 8
OPTIONS = dict(dtype="bfloat16", num_kv_pages=128, cost_table_profile="coarse")


def random_prompts(vocab: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(1)
    lengths = torch.randint(3, 30, (NUM_PROMPTS,), generator=gen).tolist()
    return [torch.randint(2, vocab, (n,), generator=gen).tolist() for n in lengths]


@pytest.fixture(scope="module")
def bf16_reference(stack, tokenizer):
    """The prompts, the bf16 target alone's greedy continuations, and the plain target for logits."""
    prompts = random_prompts(len(tokenizer))
    expected = [o.token_ids for o in LLM(str(stack), **OPTIONS).generate(prompts, GREEDY)]
    return prompts, expected, PlainTarget(str(stack), torch.bfloat16, "cpu")


@pytest.mark.parametrize("drafter", [*DRAFTERS, "ngram"])
def test_bf16_greedy_matches_the_bf16_target_up_to_near_ties(stack, bf16_reference, drafter):
    prompts, expected, plain = bf16_reference
    llm = LLM(str(stack), drafter=drafter, num_speculative_tokens=4, max_num_seqs=4, **OPTIONS)
    got = [o.token_ids for o in llm.generate(prompts, GREEDY)]
    found = divergences(plain, prompts, expected, got)
    assert (problem := check(found, len(prompts), max_diverging=NUM_PROMPTS // 4)) is None, problem
    stats = llm.engine.stats
    assert stats.drafted_tokens > 0 and stats.accepted_tokens > 0  # speculation really ran in bf16
    if drafter != "ngram":
        weights = list(llm.engine.drafter.model.parameters())
        assert weights and all(w.dtype == torch.bfloat16 for w in weights)


@pytest.mark.parametrize("drafter", DRAFTERS)
def test_bf16_proposals_hand_fp32_tensors_on_the_cpu(stack, drafter):
    """Sampled requests: q and confidences reach verification as fp32 CPU tensors, q a distribution."""
    llm = LLM(str(stack), drafter=drafter, num_speculative_tokens=4, scheduler="fixed", **OPTIONS)
    seen = []
    llm.engine.round_observers.append(lambda seq, proposal, n, verdict: seen.append(proposal))
    params = SamplingParams(temperature=0.9, top_p=0.95, max_tokens=12, ignore_eos=True, seed=3)
    first = llm.generate(["def parse(text):"], params)[0].token_ids
    assert llm.generate(["def parse(text):"], params)[0].token_ids == first  # seeded: reproducible
    drafted = [p for p in seen if p.token_ids]
    assert drafted
    for p in drafted:
        assert p.probs.dtype == torch.float32 and p.probs.device.type == "cpu"
        assert torch.allclose(p.probs.sum(-1), torch.ones(len(p.token_ids)), atol=1e-5)
        # Each token was drawn from its own row: it has probability there.
        assert all(p.probs[k, t] > 0 for k, t in enumerate(p.token_ids))
        if drafter == "dspark":
            assert p.confidence.dtype == torch.float32 and p.confidence.device.type == "cpu"
            assert p.confidence_logits.dtype == torch.float32


def test_a_drafter_placed_apart_from_its_target_is_refused(stack):
    """The drafter shares the target's embeddings and LM head: another dtype or device cannot run."""
    target = LLM(str(stack), **OPTIONS).engine.model
    common = dict(target=target, target_path=str(stack))
    with pytest.raises(ModelLoadError, match=r"asked for torch.float16 on cpu.*torch.bfloat16 on cpu"):
        create_drafter("dspark", dtype=torch.float16, device="cpu", **common)
    with pytest.raises(ModelLoadError, match=r"on cuda.*bfloat16 on cpu"):
        create_drafter("eagle3", dtype=torch.bfloat16, device="cuda", **common)
    drafter = create_drafter("dflash", dtype=torch.bfloat16, device="cpu", **common)
    assert {w.dtype for w in drafter.model.parameters()} == {torch.bfloat16}
