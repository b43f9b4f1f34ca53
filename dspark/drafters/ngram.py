"""The `ngram` drafter: prompt lookup, as vLLM's.

Find the most recent earlier occurrence of the last n tokens (n from max down to min) in the request's
own tokens and propose what followed it. Deterministic, so q is one-hot and verification stays exact.
It has no weights and no tensors on the engine's device: the lookup runs on the token ids (a short
CPU search), so the engine's dtype and device change nothing here.
"""

from __future__ import annotations

import torch

from dspark.drafter import DraftProposal, DraftRequest


class NgramDrafter:
    name = "ngram"
    target_layer_ids: tuple[int, ...] = ()
    reports_confidence = False  # so the engine profiles no cost table for it

    def __init__(
        self,
        num_speculative_tokens: int = 5,
        prompt_lookup_min: int = 1,
        prompt_lookup_max: int = 4,
        **_: object,
    ) -> None:
        if not 1 <= prompt_lookup_min <= prompt_lookup_max:
            raise ValueError("need 1 <= prompt_lookup_min <= prompt_lookup_max")
        self.max_draft_tokens = num_speculative_tokens
        self.min_n, self.max_n = prompt_lookup_min, prompt_lookup_max

    def add_context(self, seq_id, token_ids, hidden) -> None:
        pass

    def propose(self, requests: list[DraftRequest]) -> list[DraftProposal]:
        return [self._lookup(r.token_ids, min(r.num_slots, self.max_draft_tokens)) for r in requests]

    def _lookup(self, tokens: list[int], k: int) -> DraftProposal:
        if k <= 0:
            return DraftProposal([])
        seq = torch.tensor(tokens)
        for n in range(min(self.max_n, len(tokens) - 1), self.min_n - 1, -1):
            windows = seq.unfold(0, n, 1)[:-1]  # every earlier n-gram (the suffix itself excluded)
            hits = (windows == seq[-n:]).all(dim=1).nonzero()
            if len(hits):
                # The latest match predicts best, but only if k tokens follow it; in a run of repeats
                # the latest match is the suffix's neighbour with a single follower, so fall back to
                # the earliest match, which has the longest continuation.
                starts = hits[:, 0] + n
                full = starts[starts + k <= len(tokens)]
                start = int(full[-1]) if len(full) else int(starts[0])
                return DraftProposal(tokens[start : start + k])
        return DraftProposal([])

    def release(self, seq_id: str) -> None:
        pass
