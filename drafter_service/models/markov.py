"""The DSpark heads on top of the block backbone: the sequential (Markov) head and the confidence head,
as DeepSpec defines them (deepspec/modeling/dspark/{markov_head,common}.py at afdfa7c9).

Notation: h_k is slot k's backbone output after the final norm (what the LM head reads), x_{k-1} the
token before slot k (the anchor for slot 0, then the token drawn at slot k-1; teacher-forced in
training), e_k = W1[x_{k-1}] (`markov_w1`, an embedding V x r). Every head adds W2 . z_k
(`markov_w2`, r -> V, no bias) to the base logits, with z_k:
- vanilla: z_k = e_k
- gated:   z_k = sigmoid(gate_proj([h_k ; e_k])) * e_k                 (gate_proj: H + r -> r)
- rnn:     [g ; c ; o] = joint_proj([s_{k-1} ; e_k ; h_k]) split in three (joint_proj: 2r + H -> 3r),
           s_k = sigmoid(g) * s_{k-1} + (1 - sigmoid(g)) * tanh(c),  z_k = tanh(o),  s_{-1} = 0 per block
The confidence head's logit is `proj([h_k ; e_k])`, or `proj(h_k)` without the Markov input.
"""

from __future__ import annotations

import torch
from torch import nn


class MarkovHead(nn.Module):
    def __init__(self, kind: str, vocab_size: int, rank: int, hidden_size: int) -> None:
        super().__init__()
        self.kind, self.rank = kind, rank
        self.markov_w1 = nn.Embedding(vocab_size, rank)
        self.markov_w2 = nn.Linear(rank, vocab_size, bias=False)
        if kind == "gated":
            self.gate_proj = nn.Linear(hidden_size + rank, rank)
        elif kind == "rnn":
            self.joint_proj = nn.Linear(2 * rank + hidden_size, 3 * rank)
        elif kind != "vanilla":
            raise ValueError(f"unknown markov_head_type {kind!r}")

    def initial_state(self, h: torch.Tensor) -> torch.Tensor:
        """s_{-1} = 0 for slots h [..., H] (only the rnn head reads it), in h's dtype as DeepSpec keeps it."""
        return h.new_zeros(*h.shape[:-1], self.rank)

    def step(
        self, prev: torch.Tensor, h: torch.Tensor, state: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(z_k, s_k) of one slot from x_{k-1} [...], h_k [..., H] and s_{k-1} [..., r] (rnn only)."""
        e = self.markov_w1(prev)
        if self.kind == "vanilla":
            return e, state
        if self.kind == "gated":
            return torch.sigmoid(self.gate_proj(torch.cat([h, e], dim=-1))).to(e.dtype) * e, state
        gate, candidate, out = self.joint_proj(torch.cat([state, e, h], dim=-1)).chunk(3, dim=-1)
        gate = torch.sigmoid(gate)
        return torch.tanh(out), gate * state + (1.0 - gate) * torch.tanh(candidate)

    def block_latents(self, prev: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """z [..., G, r] of whole blocks, teacher-forced: prev [..., G] tokens before each slot,
        h [..., G, H]."""
        if self.kind != "rnn":
            return self.step(prev, h, None)[0]  # memoryless: every slot at once
        state, latents = self.initial_state(h[..., 0, :]), []
        for k in range(prev.shape[-1]):
            z, state = self.step(prev[..., k], h[..., k, :], state)
            latents.append(z)
        return torch.stack(latents, dim=-2)

    def bias(self, z: torch.Tensor) -> torch.Tensor:
        """W2 . z: the term added to the base logits, in fp32 like them."""
        return self.markov_w2(z).float()


class ConfidenceHead(nn.Module):
    """DeepSpec's `AcceptRatePredictor`: one logit per slot from [h_k ; e_k] (or h_k alone)."""

    def __init__(self, input_size: int) -> None:
        super().__init__()
        self.proj = nn.Linear(input_size, 1)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.proj(features).squeeze(-1).float()
