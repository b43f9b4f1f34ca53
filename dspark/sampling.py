"""Turning logits into the distribution a request samples from (temperature, top-k, top-p).

The same function shapes the target's p and the drafter's q, which verification requires.
"""

from __future__ import annotations

import torch

from dspark.sampling_params import SamplingParams


def probs_from_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Rows of logits [..., V] to probabilities after temperature, top-k and top-p (temperature > 0).

    Finite logits give a proper distribution for every accepted temperature: each row is shifted to a
    maximum of 0 before scaling (softmax does not change), so no temperature overflows it, and top-k
    and top-p always keep the row's top token.
    """
    logits = logits.float()
    logits = (logits - logits.amax(dim=-1, keepdim=True)) / params.temperature
    vocab = logits.shape[-1]
    if 0 < params.top_k < vocab:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(dim=-1)
        # Keep the smallest prefix whose mass reaches top_p: drop a token when the mass before it does.
        drop_sorted = (sorted_probs.cumsum(dim=-1) - sorted_probs) >= params.top_p
        # The top token always stays: a top_p that rounds to 0 in float32 would otherwise drop it too.
        drop_sorted[..., 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(dim=-1)


def shape_key(params: SamplingParams) -> tuple:
    """What `probs_from_logits` reads: requests with equal keys share one distribution shape."""
    return ("greedy",) if params.greedy else (params.temperature, params.top_k, params.top_p)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    return int(torch.multinomial(probs, 1, generator=generator).item())


def greedy(logits: torch.Tensor) -> int:
    return int(torch.argmax(logits).item())


def sample_rows(
    logits: torch.Tensor,  # [R, V] one row per request
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
    """One token per row, each request with its own params and generator, batched where their
    distribution shape agrees.

    Returns the tokens [R] and, per row, the distribution it was drawn from (None for greedy rows),
    both on the logits' device; q is fp32 whatever the logits' dtype: a drafter must hand
    verification exactly that q. Sampling is by inverse CDF with one uniform drawn from the request's
    own (CPU) generator, so a seeded request stays reproducible on any device.
    """
    device = logits.device
    tokens = torch.empty(len(params), dtype=torch.long, device=device)
    rows: list[torch.Tensor | None] = [None] * len(params)
    groups: dict[tuple, list[int]] = {}
    for i, p in enumerate(params):
        groups.setdefault(shape_key(p), []).append(i)
    for idx in groups.values():
        p = params[idx[0]]
        index = torch.tensor(idx, device=device)
        if p.greedy:
            tokens[index] = torch.argmax(logits[index], dim=-1)
            continue
        q = probs_from_logits(logits[index], p)
        u = torch.cat([torch.rand(1, generator=generators[i]) for i in idx]).to(device)
        tokens[index] = inverse_cdf(q, u)
        for j, i in enumerate(idx):
            rows[i] = q[j]
    return tokens, rows


def inverse_cdf(q: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The token of each row of q [R, V] where its CDF reaches u [R] (uniforms in [0, 1))."""
    cdf = q.cumsum(dim=-1)
    # Clamp the last bucket: rounding can leave cdf[-1] a hair under u.
    drawn = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None]).squeeze(1).clamp(max=q.shape[-1] - 1)
    # Never land on a zero-probability token (a top-k/top-p gap at the boundary of a bucket).
    return torch.where(q.gather(1, drawn[:, None]).squeeze(1) > 0, drawn, q.argmax(-1))
