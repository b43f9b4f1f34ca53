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
from greedy_match import Divergence, PlainTarget, check, divergences

from dspark import LLM, ModelLoadError, SamplingParams
from dspark.drafter import create_drafter

GREEDY = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
NUM_PROMPTS = 8
OPTIONS = dict(dtype="bfloat16", num_kv_pages=128, cost_table_profile="coarse")
FP32 = {**OPTIONS, "dtype": "float32"}


def acceptance(llm: LLM) -> float:
    stats = llm.engine.stats
    return stats.accepted_tokens / max(1, stats.drafted_tokens)


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


# A fixed verify length makes every round draft and verify 4 tokens, so acceptance compares across
# dtypes; DSpark also runs under its own scheduler, which ranks by its bf16 drafter's confidences.
CASES = [(drafter, "fixed") for drafter in (*DRAFTERS, "ngram")] + [("dspark", "dspark")]


@pytest.mark.parametrize(("drafter", "scheduler"), CASES)
def test_bf16_greedy_matches_the_bf16_target_up_to_near_ties(stack, bf16_reference, drafter, scheduler):
    prompts, expected, plain = bf16_reference
    options = dict(drafter=drafter, scheduler=scheduler, num_speculative_tokens=4, max_num_seqs=4)
    llm = LLM(str(stack), **options, **OPTIONS)
    got = [o.token_ids for o in llm.generate(prompts, GREEDY)]
    found = divergences(plain, prompts, expected, got)
    assert (problem := check(found, len(prompts), max_diverging=NUM_PROMPTS // 4)) is None, problem
    # The engine would survive a failing drafter by decoding plainly: it must not have failed at all.
    assert llm.engine.stats.drafted_tokens > 0 and llm.engine.stats.drafter_failures == 0
    if drafter != "ngram":
        weights = list(llm.engine.drafter.model.parameters())
        assert weights and all(w.dtype == torch.bfloat16 for w in weights)
    if scheduler == "fixed":
        # The drafter drafts in bf16 about as well as in fp32 (a misplaced cache or position would not).
        full = LLM(str(stack), **options, **FP32)
        full.generate(prompts, GREEDY)
        assert abs(acceptance(llm) - acceptance(full)) <= 0.05, (acceptance(llm), acceptance(full))


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
    assert drafted and llm.engine.stats.drafter_failures == 0
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


def test_the_near_tie_rule_refuses_what_is_no_near_tie(bf16_reference):
    """The rule can fail: a token that is not the runner-up, or a runner-up behind a clear gap."""
    prompts, expected, plain = bf16_reference
    prompt, want = prompts[0], expected[0]
    gaps = []
    for pos in range(len(want)):
        top = torch.topk(plain.last_logits(prompt + want[:pos]), 3)
        gaps.append((float(top.values[0] - top.values[1]), pos, top.indices.tolist()))
    gap, pos, (_, second, third) = max(gaps)
    assert gap > 0.5  # a clear winner exists somewhere in the continuation
    for wrong in (second, third):
        got = want[:pos] + [wrong]
        found = divergences(plain, [prompt], [want], [got])
        assert len(found) == 1 and found[0].position == pos and not found[0].near_tie
        assert "no near-tie" in check(found, 1, max_diverging=1)
    # And many near-ties at once are too many.
    ties = [Divergence(i, 3, 1, 2, 0.0, 0.1, (2, 1)) for i in range(3)]
    assert "3 of 8 prompts diverge" in check(ties, 8, max_diverging=2)
