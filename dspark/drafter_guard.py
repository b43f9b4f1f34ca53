"""The drafter as the engine calls it: a drafter's fault costs a round of drafting, never a request.

Drafting only ever buys speed: verification is lossless for any proposal, and a round that verifies
no drafted token is plain decoding. So when the drafter raises, or hands back a proposal that is
malformed (too long, token ids outside the vocabulary, q or confidences of the wrong shape) or not
finite (NaN or inf draft probabilities or confidences), the requests affected verify 0 drafted tokens
this round. A batch that raises is retried one request at a time, so a request that upsets the
drafter does not cost the others their drafts. A request the drafter failed `max_failures` times
(or whose context the drafter failed to take in) decodes plainly to its end.

Every fault is counted in `EngineStats.drafter_failures`; the first one is logged, the rest are not,
so a broken drafter cannot flood the log once per step.
"""

from __future__ import annotations

import logging
from collections import Counter

import torch

from dspark.drafter import Drafter, DraftProposal, DraftRequest
from dspark.stats import EngineStats

log = logging.getLogger(__name__)
# Probabilities a hair above 1 are rounding (bf16 softmax); anything further is not a probability.
_ROUNDING = 1e-3


class DrafterGuard:
    def __init__(self, vocab_size: int, max_failures: int, stats: EngineStats) -> None:
        self.vocab_size, self.max_failures, self.stats = vocab_size, max_failures, stats
        self.failures: Counter[str] = Counter()  # faults per running request
        self.disabled: set[str] = set()  # requests that decode plainly from now on
        self._logged = False

    def drafting(self, seq_id: str) -> bool:
        return seq_id not in self.disabled

    def propose(self, drafter: Drafter, requests: list[DraftRequest]) -> list[DraftProposal]:
        """One proposal per request, in order: the drafter's, or an empty one wherever it failed."""
        try:
            proposals = list(drafter.propose(requests))
            if len(proposals) != len(requests):
                raise ValueError(f"{len(proposals)} proposals for {len(requests)} requests")
        except Exception as exc:
            if len(requests) == 1:
                self._fault(drafter, requests[0].seq_id, exc)
                return [DraftProposal([])]
            self._fault(drafter, None, exc)
            return [self.propose(drafter, [r])[0] for r in requests]
        out = []
        for r, p, problem in zip(requests, proposals, self._problems(requests, proposals)):
            if problem is not None:
                self._fault(drafter, r.seq_id, ValueError(f"proposal for {r.seq_id}: {problem}"))
            out.append(p if problem is None else DraftProposal([]))
        return out

    def add_context(self, drafter: Drafter, seq_id: str, token_ids: list[int], hidden) -> None:
        if seq_id in self.disabled:
            return
        try:
            drafter.add_context(seq_id, token_ids, hidden)
        except Exception as exc:  # its context now has a gap: no later proposal could be built on it
            self._fault(drafter, seq_id, exc, disable=True)

    def release(self, drafter: Drafter, seq_id: str) -> None:
        self.failures.pop(seq_id, None)
        self.disabled.discard(seq_id)
        try:
            drafter.release(seq_id)
        except Exception as exc:
            self._fault(drafter, None, exc)

    def _fault(self, drafter: Drafter, seq_id: str | None, exc: Exception, disable: bool = False) -> None:
        self.stats.drafter_failures += 1
        if not self._logged:
            self._logged = True
            log.warning(
                "drafter %s failed: %r; affected requests decode without drafts for the round "
                "(further failures are counted in stats.drafter_failures, not logged)",
                getattr(drafter, "name", type(drafter).__name__),
                exc,
                exc_info=exc,
            )
        if seq_id is not None:
            self.failures[seq_id] += 1
            if disable or self.failures[seq_id] >= self.max_failures:
                self.disabled.add(seq_id)

    def _problems(self, requests: list[DraftRequest], proposals: list) -> list[str | None]:
        """Why each proposal cannot be verified, or None: shapes first, then one read of all values."""
        problems = [self._shape_problem(r, p) for r, p in zip(requests, proposals)]
        checks: list[tuple[int, str, torch.Tensor]] = []
        for i, (p, problem) in enumerate(zip(proposals, problems)):
            if problem is None:
                for what, t in (("draft probabilities", p.probs), ("confidences", p.confidence)):
                    if t is not None and t.numel():
                        checks.append((i, what, (t.amin() >= 0) & (t.amax() <= 1 + _ROUNDING)))
        for (i, what, _), ok in zip(checks, _read_flags([flag for _, _, flag in checks])):
            if not ok and problems[i] is None:
                problems[i] = f"{what} are not finite values in [0, 1]"
        return problems

    def _shape_problem(self, r: DraftRequest, p: object) -> str | None:
        if not isinstance(p, DraftProposal):
            return f"got a {type(p).__name__}, not a DraftProposal"
        n = len(p.token_ids)
        if n > r.num_slots:
            return f"{n} tokens for {r.num_slots} slots"
        if not all(isinstance(t, int) and 0 <= t < self.vocab_size for t in p.token_ids):
            return f"token ids outside [0, {self.vocab_size})"
        if p.probs is not None and (
            not isinstance(p.probs, torch.Tensor) or tuple(p.probs.shape) != (n, self.vocab_size)
        ):
            return f"draft probabilities of shape {_shape(p.probs)}, expected ({n}, {self.vocab_size})"
        c = p.confidence
        if c is not None and (not isinstance(c, torch.Tensor) or c.dim() != 1 or len(c) < n):
            return f"confidences of shape {_shape(c)} for {n} tokens"
        return None


def _shape(t: object) -> object:
    return tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__


def _read_flags(flags: list[torch.Tensor]) -> list[bool]:
    """Read 0-d bool tensors with one transfer per device rather than one per flag."""
    values = [True] * len(flags)
    by_device: dict[torch.device, list[int]] = {}
    for i, flag in enumerate(flags):
        by_device.setdefault(flag.device, []).append(i)
    for idx in by_device.values():
        for i, v in zip(idx, torch.stack([flags[i] for i in idx]).tolist()):
            values[i] = v
    return values
