"""Drafters used only by tests, to drive verification through every path (named as such)."""

from __future__ import annotations

import torch

from dspark.drafter import DraftProposal, DraftRequest
from dspark.sampling import probs_from_logits
from dspark.sampling_params import SamplingParams


class ScriptedDrafter:
    """Test drafter: proposes a known continuation (e.g. the target's own greedy output) with every
    `corrupt_every`-th slot replaced, so rounds end in full accepts and in partial rejections."""

    name = "scripted"
    target_layer_ids: tuple[int, ...] = ()

    def __init__(
        self, continuations: dict[tuple[int, ...], list[int]], gamma: int = 4, corrupt_every: int = 3
    ):
        self.continuations, self.max_draft_tokens, self.corrupt_every = continuations, gamma, corrupt_every
        self.calls = 0

    def add_context(self, seq_id, token_ids, hidden) -> None:
        pass

    def propose(self, requests: list[DraftRequest]) -> list[DraftProposal]:
        out = []
        for r in requests:
            self.calls += 1
            for prompt, cont in self.continuations.items():
                full = list(prompt) + cont
                if full[: len(r.token_ids)] == r.token_ids:
                    draft = full[len(r.token_ids) : len(r.token_ids) + r.num_slots]
                    if self.calls % self.corrupt_every == 0 and draft:
                        draft[-1] = (draft[-1] + 1) % 50
                    out.append(DraftProposal(draft))
                    break
            else:
                out.append(DraftProposal([]))
        return out

    def release(self, seq_id) -> None:
        pass


class AdversarialDrafter:
    """Test drafter: samples from a fixed distribution q far from the target's, and reports that q."""

    name = "adversarial"
    target_layer_ids: tuple[int, ...] = ()

    def __init__(self, logits: torch.Tensor, gamma: int = 3) -> None:
        self.logits, self.max_draft_tokens = logits, gamma
        self.seen: dict[str, int] = {}
        self.generator = torch.Generator().manual_seed(0)

    def add_context(self, seq_id, token_ids, hidden) -> None:
        self.seen[seq_id] = self.seen.get(seq_id, 0) + len(token_ids)

    def propose(self, requests: list[DraftRequest]) -> list[DraftProposal]:
        out = []
        for r in requests:
            # Greedy requests ignore q; sample the proposal at temperature 1 all the same.
            params = SamplingParams(temperature=1.0) if r.params.greedy else r.params
            q = probs_from_logits(self.logits, params).expand(r.num_slots, -1)
            tokens = torch.multinomial(q, 1, generator=r.generator or self.generator)[:, 0].tolist()
            out.append(DraftProposal(tokens, probs=q, confidence=torch.full((r.num_slots,), 0.5)))
        return out

    def release(self, seq_id) -> None:
        self.seen.pop(seq_id, None)
