"""Drawing a drafted block slot by slot for a round's requests, each with its own params and generator.

A block drafter walks its slots in order (each slot conditions on the token drawn before it), so it
draws gamma times per round. Everything that depends only on the requests is settled once per round
here: which rows are greedy, which rows share a distribution shape (temperature, top-k, top-p; not
seeds or lengths), and every uniform the round consumes (num_slots per request, from its own CPU
generator, as `sample_rows` would draw them one slot at a time). Each slot then costs one argmax and,
per distinct shape, one batched inverse-CDF draw.

The q kept for a sampled row is exactly the distribution its token was drawn from (fp32, shaped by
`probs_from_logits` as the target's p is), which verification requires.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dspark.sampling import inverse_cdf, probs_from_logits, shape_key
from dspark.sampling_params import SamplingParams


@dataclass
class _Group:
    params: SamplingParams
    rows: list[int]
    index: torch.Tensor | None  # the rows as an index tensor; None when the group is every row in order
    uniforms: torch.Tensor  # [len(rows), steps]
    q: torch.Tensor | None = None  # [len(rows), steps, V], filled slot by slot


class BlockSampler:
    def __init__(
        self,
        params: list[SamplingParams],
        generators: list[torch.Generator | None],
        num_slots: list[int],
        device: torch.device,
    ) -> None:
        self.steps = max(num_slots)
        rows_of: dict[tuple, list[int]] = {}
        for i, p in enumerate(params):
            if not p.greedy:
                rows_of.setdefault(shape_key(p), []).append(i)
        self.groups: list[_Group] = []
        for rows in rows_of.values():
            p = params[rows[0]]
            uniforms = torch.zeros(len(rows), self.steps)
            for j, i in enumerate(rows):
                uniforms[j, : num_slots[i]] = torch.rand(num_slots[i], generator=generators[i])
            every_row = rows == list(range(len(params)))
            index = None if every_row else torch.tensor(rows, device=device)
            self.groups.append(_Group(p, rows, index, uniforms.to(device)))

    def draw(self, logits: torch.Tensor, k: int) -> torch.Tensor:
        """Tokens [R] of slot k from its fp32 logits [R, V]: greedy rows by argmax, the rest sampled."""
        # A group without an index is every row: nothing is greedy then.
        every_row = len(self.groups) == 1 and self.groups[0].index is None
        tokens = None if every_row else logits.argmax(dim=-1)
        for g in self.groups:
            q = probs_from_logits(logits if g.index is None else logits[g.index], g.params)
            if g.q is None:
                g.q = q.new_empty(len(g.rows), self.steps, q.shape[-1])
            g.q[:, k] = q
            drawn = inverse_cdf(q, g.uniforms[:, k])
            if g.index is None:
                return drawn
            tokens[g.index] = drawn
        return tokens

    def probs(self) -> list[tuple[list[int], torch.Tensor]]:
        """Per params group: its rows and their q [rows, steps, V] (slots past a row's num_slots unused)."""
        return [(g.rows, g.q) for g in self.groups if g.q is not None]
