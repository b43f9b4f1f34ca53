"""Sampled output follows the target's exact distribution, whatever the drafter proposes.

A small-vocabulary target and an adversarial drafter (its q far from the target's p) run through the
whole engine; the emitted tokens at the first positions are compared with the target's exact marginals
(computed by transformers, independently of our runner) with a chi-square test. The same test run with
a deliberately broken verifier (no residual resampling) must fail, which shows the test has power.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from lossless_check import (
    LONG_PROMPT,
    PARAMS,
    PROMPT,
    SAMPLES,
    VOCAB,
    build_small_vocab_target,
    exact_marginals,
    p_values,
    sample_counts,
)
from scipy.stats import chisquare
from test_drafters import AdversarialDrafter

import dspark.engine
from dspark import SamplingParams
from dspark.config import EngineConfig
from dspark.engine import Engine
from dspark.sampling import probs_from_logits, sample
from dspark.verify import Verdict, verify


@pytest.fixture(scope="module")
def small_vocab_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("small_vocab")
    build_small_vocab_target(path)
    return path


def sample_through_engine(
    path, params: SamplingParams, prompt: list[int] = PROMPT, **options
) -> torch.Tensor:
    engine = Engine(
        EngineConfig(
            model=str(path),
            max_num_seqs=64,
            num_speculative_tokens=3,
            num_kv_pages=256 if prompt is PROMPT else 512,
            kv_page_size=4,
            seed=11,
            **options,
        )
    )
    # The drafter favours exactly the tokens the target dislikes at the start of the continuation.
    first = torch.log_softmax(torch.randn(VOCAB, generator=torch.Generator().manual_seed(5)), -1)
    engine.drafter = AdversarialDrafter(-3 * first, gamma=3)
    engine.gamma = engine.policy.gamma = 3
    counts = sample_counts(engine, params, prompt=prompt)
    if engine.config.enable_prefix_caching and prompt is LONG_PROMPT:
        # Every request but the first wave of 64 (admitted before the first page was committed)
        # reused the three cached pages; the rest of the check is the same.
        assert engine.stats.cached_prompt_tokens >= (SAMPLES - 64) * 12
    assert engine.stats.drafted_tokens > SAMPLES  # the drafter really took part
    assert 0 < engine.stats.accepted_tokens < engine.stats.drafted_tokens
    return counts


def broken_verify(target_logits, draft_tokens, draft_probs, params, generator) -> Verdict:
    """The classic bug: on rejection, sample from p instead of the residual norm(max(0, p - q))."""
    verdict = verify(target_logits, draft_tokens, draft_probs, params, generator)
    if verdict.num_accepted < len(draft_tokens):
        p = probs_from_logits(target_logits[verdict.num_accepted], params)
        return Verdict(verdict.num_accepted, sample(p, generator))
    return verdict


@pytest.mark.parametrize("params", PARAMS, ids=["t1", "t0.8-topk-topp"])
def test_emitted_distribution_matches_target(small_vocab_dir, params):
    expected = exact_marginals(small_vocab_dir, params)
    pvals = p_values(sample_through_engine(small_vocab_dir, params), expected)
    assert min(pvals) > 1e-3, pvals


def test_emitted_distribution_matches_target_with_a_cached_prefix(small_vocab_dir):
    params = PARAMS[0]
    expected = exact_marginals(small_vocab_dir, params, LONG_PROMPT)
    counts = sample_through_engine(small_vocab_dir, params, LONG_PROMPT, enable_prefix_caching=True)
    pvals = p_values(counts, expected)
    assert min(pvals) > 1e-3, pvals


def test_broken_verifier_is_detected(small_vocab_dir, monkeypatch):
    monkeypatch.setattr(dspark.engine, "verify", broken_verify)
    params = PARAMS[0]
    expected = exact_marginals(small_vocab_dir, params)
    pvals = p_values(sample_through_engine(small_vocab_dir, params), expected)
    assert min(pvals[1:]) < 1e-6, pvals  # drafted positions are biased; position 0 is not drafted


def test_verify_single_slot_matches_p_exactly_in_expectation():
    """Function level: P(emit x) = q(x) min(1, p/q) + P(reject) residual(x) = p(x), over many draws."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0], [0.0, 0.0, 0.0, 0.0]])
    params = SamplingParams(temperature=1.0)
    p = probs_from_logits(logits[0], params)
    q = torch.tensor([0.05, 0.05, 0.3, 0.6])
    counts = torch.zeros(4)
    for _ in range(20000):
        x = int(torch.multinomial(q, 1, generator=gen))
        verdict = verify(logits, [x], q[None], params, gen)
        counts[x if verdict.num_accepted else verdict.next_token] += 1
    assert chisquare(counts.numpy(), (p * counts.sum()).numpy()).pvalue > 1e-3


def test_greedy_verify_accepts_matching_prefix_and_corrects():
    logits = torch.full((4, 5), -1.0)
    for row, best in enumerate([2, 4, 1, 3]):
        logits[row, best] = 1.0
    params = SamplingParams(temperature=0)
    assert verify(logits, [2, 4, 0], None, params, None) == Verdict(2, 1)
    assert verify(logits, [2, 4, 1], None, params, None) == Verdict(3, 3)
    assert verify(logits[:1], [], None, params, None) == Verdict(0, 2)


def test_seeded_requests_reproduce(small_vocab_dir):
    params = SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True, seed=1234)
    runs = []
    for _ in range(2):
        engine = Engine(EngineConfig(model=str(small_vocab_dir), num_kv_pages=64, kv_page_size=4))
        engine.drafter = AdversarialDrafter(torch.zeros(VOCAB), gamma=3)
        engine.gamma = engine.policy.gamma = 3
        engine.add_request(PROMPT, params, request_id="r")
        # A different unseeded neighbour must not disturb the seeded request's draws.
        engine.add_request(PROMPT, SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True))
        outs = {}
        while engine.has_unfinished():
            outs.update({o.request_id: o.token_ids for o in engine.step() if o.finished})
        runs.append(outs["r"])
    assert runs[0] == runs[1]
    assert len(set(itertools.chain(runs[0]))) > 1
