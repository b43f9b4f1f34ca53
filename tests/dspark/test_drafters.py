"""Drafters used only by tests, to drive verification through every path (named as such)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from dspark.drafter import DraftProposal, DraftRequest
from dspark.sampling import probs_from_logits
from dspark.sampling_params import SamplingParams

# confidence(slot, previous_token): like DSpark's head, slot k's confidence reads the token before it
# (the anchor for slot 1), so it is known before slot k is drawn but depends on what was drawn.
Confidence = Callable[[int, int], float]


def confidences(confidence: Confidence, anchor: int, tokens: list[int]) -> torch.Tensor:
    return torch.tensor([confidence(k, prev) for k, prev in enumerate([anchor, *tokens[:-1]], start=1)])


class ScriptedDrafter:
    """Test drafter: proposes a known continuation (e.g. the target's own greedy output) with every
    `corrupt_every`-th slot replaced, so rounds end in full accepts and in partial rejections; reports
    confidences when given a `confidence` function."""

    name = "scripted"
    target_layer_ids: tuple[int, ...] = ()

    def __init__(
        self,
        continuations: dict[tuple[int, ...], list[int]],
        gamma: int = 4,
        corrupt_every: int = 3,
        confidence: Confidence | None = None,
    ):
        self.continuations, self.max_draft_tokens, self.corrupt_every = continuations, gamma, corrupt_every
        self.confidence = confidence
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
                    conf = None
                    if self.confidence is not None and draft:
                        conf = confidences(self.confidence, r.token_ids[-1], draft)
                    out.append(DraftProposal(draft, confidence=conf))
                    break
            else:
                out.append(DraftProposal([]))
        return out

    def release(self, seq_id) -> None:
        pass


class AdversarialDrafter:
    """Test drafter: samples from a fixed distribution q far from the target's, and reports that q
    (and confidences from `confidence`, 0.5 everywhere by default)."""

    name = "adversarial"
    target_layer_ids: tuple[int, ...] = ()

    def __init__(self, logits: torch.Tensor, gamma: int = 3, confidence: Confidence | None = None) -> None:
        self.logits, self.max_draft_tokens = logits, gamma
        self.confidence = confidence or (lambda slot, previous: 0.5)
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
            conf = confidences(self.confidence, r.token_ids[-1], tokens)
            out.append(DraftProposal(tokens, probs=q, confidence=conf))
        return out

    def release(self, seq_id) -> None:
        self.seen.pop(seq_id, None)
