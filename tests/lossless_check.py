"""The statistical losslessness check shared by the engine's and the drafters' tests.

A small-vocabulary target makes the target's exact marginals at the first positions computable by
enumeration (with transformers, independently of our runner); sampled outputs from the engine are
compared with them by chi-square per position.
"""

from __future__ import annotations

import torch
from scipy.stats import chisquare
from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM

from dspark import SamplingParams
from dspark.engine import Engine
from dspark.sampling import probs_from_logits

VOCAB, PROMPT, SAMPLES, POSITIONS = 8, [1, 2, 3], 3000, 3
# Three full pages of 4 tokens and one more: with prefix caching, every request after the first
# reuses the K/V of the first three pages (the last prompt token always runs).
LONG_PROMPT = [1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5]
# max_tokens leaves room for a full 3-token draft after the first (prefill) token.
PARAMS = [
    SamplingParams(temperature=1.0, max_tokens=POSITIONS + 2, ignore_eos=True),
    SamplingParams(temperature=0.8, top_k=6, top_p=0.9, max_tokens=POSITIONS + 2, ignore_eos=True),
]


def build_small_vocab_target(path) -> None:
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
    model.save_pretrained(path, safe_serialization=True)


def exact_marginals(path, params: SamplingParams, prompt: list[int] = PROMPT) -> torch.Tensor:
    """[POSITIONS, VOCAB]: P(token at position i) under the target alone, by enumerating prefixes."""
    reference = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    marginals = torch.zeros(POSITIONS, VOCAB)
    prefix_prob = {(): 1.0}
    with torch.no_grad():
        for pos in range(POSITIONS):
            next_prob = {}
            for prefix, mass in prefix_prob.items():
                logits = reference(torch.tensor([prompt + list(prefix)])).logits[0, -1]
                p = probs_from_logits(logits, params)
                marginals[pos] += mass * p
                for t in range(VOCAB):
                    next_prob[prefix + (t,)] = mass * float(p[t])
            prefix_prob = next_prob
    return marginals


def sample_counts(
    engine: Engine, params: SamplingParams, samples: int = SAMPLES, prompt: list[int] = PROMPT
) -> torch.Tensor:
    """[POSITIONS, VOCAB] counts of emitted tokens over `samples` requests of `prompt`."""
    counts = torch.zeros(POSITIONS, VOCAB)
    started = 0
    while started < samples or engine.has_unfinished():
        while started < samples and len(engine.seqs) < engine.config.max_num_seqs:
            engine.add_request(prompt, params)
            started += 1
        for out in engine.step():
            if out.finished:
                for pos, t in enumerate(out.token_ids[:POSITIONS]):
                    counts[pos, t] += 1
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
