"""How many drafted tokens of each request the target verifies this round.

This is the plug-in point for the DSpark prefix scheduler: a policy sees every running request's
proposal (tokens and confidences) and the step's token budget, and returns one length per request.
"""

from __future__ import annotations

from typing import Protocol

from dspark.drafter import DraftProposal


class VerifyLengthPolicy(Protocol):
    def choose(self, proposals: list[DraftProposal], token_budget: int) -> list[int]:
        """Verify lengths l_r <= len(proposal r); sum(l_r + 1) must stay within token_budget."""


class FixedLength:
    """Verify up to gamma drafted tokens of every request (what plain speculative decoding does)."""

    def __init__(self, gamma: int) -> None:
        self.gamma = gamma

    def choose(self, proposals: list[DraftProposal], token_budget: int) -> list[int]:
        lengths = [min(self.gamma, len(p.token_ids)) for p in proposals]
        # Over budget: trim the longest windows first so every request keeps its anchor.
        spare = token_budget - sum(lengths) - len(lengths)
        while spare < 0 and any(lengths):
            i = max(range(len(lengths)), key=lambda r: (lengths[r], -r))
            lengths[i] -= 1
            spare += 1
        return lengths
