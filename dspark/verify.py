"""Lossless verification of drafted tokens (docs/ALGORITHM.md §6).

Given the target's logits at the anchor and at each of the l drafted slots (l + 1 rows), accept a
prefix of the draft and emit one more token: the correction at the first rejection, or a bonus token
when everything was accepted. The emitted sequence is distributed exactly as sampling the target
alone; at temperature 0 it is the target's greedy continuation, token for token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dspark.sampling import probs_from_logits, sample
from dspark.sampling_params import SamplingParams


@dataclass(frozen=True)
class Verdict:
    num_accepted: int
    next_token: int

    @property
    def tokens_gained(self) -> int:
        return self.num_accepted + 1


def verify(
    target_logits: torch.Tensor,  # [l + 1, V]
    draft_tokens: list[int],  # l tokens
    draft_probs: torch.Tensor | None,  # [l, V] shaped like p, or None for a deterministic proposal
    params: SamplingParams,
    generator: torch.Generator | None,
) -> Verdict:
    num_draft = len(draft_tokens)
    if params.greedy:
        targets = torch.argmax(target_logits, dim=-1).tolist()
        n = 0
        while n < num_draft and draft_tokens[n] == targets[n]:
            n += 1
        return Verdict(n, targets[n])

    p = probs_from_logits(target_logits, params)
    if num_draft == 0:
        return Verdict(0, sample(p[0], generator))
    idx = torch.arange(num_draft)
    tokens = torch.tensor(draft_tokens)
    if draft_probs is None:  # a deterministic proposal is a one-hot q
        q = torch.zeros(num_draft, p.shape[-1]).index_put_((idx, tokens), torch.tensor(1.0))
    else:
        q = draft_probs.float()
    p_x, q_x = p[idx, tokens], q[idx, tokens]
    u = torch.rand(num_draft, generator=generator)
    # Accept x_k with probability min(1, p/q); written as u * q < p to avoid dividing by q = 0.
    rejected = (u * q_x >= p_x).nonzero()
    if len(rejected) == 0:
        return Verdict(num_draft, sample(p[num_draft], generator))
    k = int(rejected[0])
    residual = (p[k] - q[k]).clamp_min(0)
    total = residual.sum()
    # p == q leaves no residual mass; then rejection had probability 0 and p itself is the answer.
    return Verdict(k, sample(residual / total if total > 0 else p[k], generator))
