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
from scipy.stats import chisquare
from test_drafters import AdversarialDrafter
from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM

import dspark.engine
from dspark import SamplingParams
from dspark.config import EngineConfig
from dspark.engine import Engine
from dspark.sampling import probs_from_logits, sample
from dspark.verify import Verdict, verify

VOCAB, PROMPT, SAMPLES, POSITIONS = 8, [1, 2, 3], 3000, 3
# max_tokens leaves room for a full 3-token draft after the first (prefill) token.
PARAMS = [
    SamplingParams(temperature=1.0, max_tokens=POSITIONS + 2, ignore_eos=True),
    SamplingParams(temperature=0.8, top_k=6, top_p=0.9, max_tokens=POSITIONS + 2, ignore_eos=True),
]


@pytest.fixture(scope="module")
def small_vocab_dir(tmp_path_factory):
    torch.manual_seed(3)
    config = Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        eos_token_id=None,
    )
    model = Qwen3ForCausalLM(config)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.5)
    path = tmp_path_factory.mktemp("small_vocab")
    model.save_pretrained(path, safe_serialization=True)
    return path


def exact_marginals(path, params: SamplingParams) -> torch.Tensor:
    """[POSITIONS, VOCAB]: P(token at position i) under the target alone, by enumerating prefixes."""
    reference = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    marginals = torch.zeros(POSITIONS, VOCAB)
    prefix_prob = {(): 1.0}
    with torch.no_grad():
        for pos in range(POSITIONS):
            next_prob = {}
            for prefix, mass in prefix_prob.items():
                logits = reference(torch.tensor([PROMPT + list(prefix)])).logits[0, -1]
                p = probs_from_logits(logits, params)
                marginals[pos] += mass * p
                for t in range(VOCAB):
                    next_prob[prefix + (t,)] = mass * float(p[t])
            prefix_prob = next_prob
    return marginals


def sample_through_engine(path, params: SamplingParams) -> torch.Tensor:
    engine = Engine(
        EngineConfig(
            model=str(path),
            max_num_seqs=64,
            num_speculative_tokens=3,
            num_kv_blocks=256,
            block_size=4,
            seed=11,
        )
    )
    # The drafter favours exactly the tokens the target dislikes at the start of the continuation.
    first = torch.log_softmax(torch.randn(VOCAB, generator=torch.Generator().manual_seed(5)), -1)
    engine.drafter = AdversarialDrafter(-3 * first, gamma=3)
    engine.gamma = engine.policy.gamma = 3
    counts = torch.zeros(POSITIONS, VOCAB)
    started = 0
    while started < SAMPLES or engine.has_unfinished():
        while started < SAMPLES and len(engine.seqs) < 64:
            engine.add_request(PROMPT, params)
            started += 1
        for out in engine.step():
            if out.finished:
                for pos, t in enumerate(out.token_ids[:POSITIONS]):
                    counts[pos, t] += 1
    assert engine.stats.drafted_tokens > SAMPLES  # the drafter really took part
    assert 0 < engine.stats.accepted_tokens < engine.stats.drafted_tokens
    return counts


def p_values(counts: torch.Tensor, expected: torch.Tensor) -> list[float]:
    out = []
    for pos in range(POSITIONS):
        keep = expected[pos] > 0
        assert counts[pos][~keep].sum() == 0, "a token the target can never emit was emitted"
        if keep.sum() == 1:  # one possible token: the check above already proved the match
            out.append(1.0)
            continue
        exp = expected[pos][keep] * counts[pos].sum()
        out.append(float(chisquare(counts[pos][keep].numpy(), exp.numpy()).pvalue))
    return out


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
        engine = Engine(EngineConfig(model=str(small_vocab_dir), num_kv_blocks=64, block_size=4))
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
