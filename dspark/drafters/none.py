"""The `none` drafter: proposes nothing, so every round verifies only the anchor (plain decoding)."""

from __future__ import annotations

from dspark.drafter import DraftProposal, DraftRequest


class NoDrafter:
    name = "none"
    target_layer_ids: tuple[int, ...] = ()
    max_draft_tokens = 0

    def __init__(self, **_: object) -> None:
        pass

    def add_context(self, seq_id, token_ids, hidden) -> None:
        pass

    def propose(self, requests: list[DraftRequest]) -> list[DraftProposal]:
        return [DraftProposal([]) for _ in requests]

    def release(self, seq_id: str) -> None:
        pass
