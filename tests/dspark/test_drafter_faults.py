"""A faulty drafter costs drafts, never requests: whatever it does (raise, NaN confidences or draft
probabilities, malformed proposals, a broken context), greedy output stays token-identical to plain
decoding, every fault is counted, and a request the drafter keeps failing stops being drafted for."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
from test_drafters import ScriptedDrafter
from test_engine_greedy import prompts_of_mixed_length, reference, run_staggered, small_batch_config

from dspark.drafter import DraftProposal, DraftRequest
from dspark.engine import Engine


class FaultyDrafter(ScriptedDrafter):
    """Test drafter: proposes the target's own continuation (so drafts are accepted), and injects
    `mode` faults into every `every`-th call or proposal, or always for the request whose prompt
    is `victim`; counts each fault it injected."""

    def __init__(self, continuations, mode: str, every: int = 3, victim: tuple[int, ...] | None = None):
        super().__init__(continuations, gamma=4, corrupt_every=10**9)
        self.mode, self.every, self.victim = mode, every, victim
        self.propose_calls = 0
        self.faults = 0
        self.asked: Counter[str] = Counter()  # proposals requested per request

    def _is_victim(self, r: DraftRequest) -> bool:
        return self.victim is not None and tuple(r.token_ids[: len(self.victim)]) == self.victim

    def add_context(self, seq_id, token_ids, hidden) -> None:
        if self.mode == "context" and seq_id == "1" and not self.faults:  # its first prompt chunk
            self.faults += 1
            raise RuntimeError("drafter lost this request's context")

    def propose(self, requests: list[DraftRequest]) -> list[DraftProposal]:
        self.propose_calls += 1
        self.asked.update(r.seq_id for r in requests)
        if self.mode == "raises" and (
            self.propose_calls % self.every == 0 or any(self._is_victim(r) for r in requests)
        ):
            self.faults += 1
            raise RuntimeError("drafter out of memory")
        proposals = super().propose(requests)
        for k, (r, p) in enumerate(zip(requests, proposals)):
            if self.mode in CORRUPTIONS and p.token_ids and (self.calls + k) % self.every == 0:
                self.faults += 1
                proposals[k] = self._corrupt(r, p)
        return proposals

    def _corrupt(self, r: DraftRequest, p: DraftProposal) -> DraftProposal:
        n = len(p.token_ids)
        if self.mode == "nan_confidence":
            return DraftProposal(p.token_ids, confidence=torch.full((n,), math.nan))
        if self.mode == "nan_probs":
            return DraftProposal(p.token_ids, probs=torch.full((n, VOCAB), math.nan))
        if self.mode == "inf_confidence":
            return DraftProposal(p.token_ids, confidence=torch.full((n,), math.inf))
        if self.mode == "too_long":
            return DraftProposal(p.token_ids + [0] * (r.num_slots + 1 - n))
        assert self.mode == "out_of_vocab"
        return DraftProposal([*p.token_ids[:-1], VOCAB + 7])


VOCAB = 384  # the test tokenizer's (checked below)
CORRUPTIONS = ("nan_confidence", "nan_probs", "inf_confidence", "too_long", "out_of_vocab")


@pytest.mark.parametrize("mode", ["raises", *CORRUPTIONS, "context"])
def test_faulty_drafter_changes_nothing_but_speed(qwen3_dir, mode):
    engine = Engine(small_batch_config(qwen3_dir))
    assert engine.model_config.vocab_size == VOCAB  # so NaN q fails on its values, not its shape
    prompts = prompts_of_mixed_length(engine.model_config.vocab_size)
    expected = reference(qwen3_dir, prompts)
    drafter = FaultyDrafter({tuple(p): e for p, e in zip(prompts, expected)}, mode)
    engine.drafter, engine.gamma = drafter, 4

    assert run_staggered(engine, prompts) == expected
    stats = engine.stats
    assert drafter.faults > 0 and stats.drafter_failures == drafter.faults
    assert stats.failed_requests == 0 and stats.finished_requests == len(prompts)
    assert stats.accepted_tokens > 0  # the rounds without faults still drafted
    assert engine.pages.num_free_pages == engine.pages.num_pages
    if mode == "context":  # a gap in its context: request 1 is never drafted for again
        assert drafter.faults == 1 and engine.draft_guard.disabled == set()  # released at its end
        assert drafter.asked["1"] == 0


def test_a_request_that_upsets_the_drafter_costs_only_its_own_drafts(qwen3_dir):
    engine = Engine(small_batch_config(qwen3_dir))
    prompts = prompts_of_mixed_length(engine.model_config.vocab_size)
    expected = reference(qwen3_dir, prompts)
    # Any batch holding request 2 raises; retried one by one, only request 2's proposal fails.
    drafter = FaultyDrafter(
        {tuple(p): e for p, e in zip(prompts, expected)}, "raises", every=10**9, victim=tuple(prompts[2])
    )
    engine.drafter, engine.gamma = drafter, 4

    assert run_staggered(engine, prompts) == expected
    limit = engine.config.max_drafter_failures
    # Request 2 is asked at most twice per failed round (in its batch, then alone), `limit` rounds.
    assert limit <= drafter.asked["2"] <= 2 * limit
    assert engine.stats.drafter_failures == drafter.faults
    others = [rid for rid in map(str, range(len(prompts))) if rid != "2"]
    assert all(drafter.asked[rid] > 0 for rid in others)
    assert engine.stats.accepted_tokens > 0 and engine.stats.failed_requests == 0


def test_the_first_drafter_fault_is_logged_the_rest_only_counted(qwen3_dir, caplog):
    engine = Engine(small_batch_config(qwen3_dir))
    prompts = prompts_of_mixed_length(engine.model_config.vocab_size)
    expected = reference(qwen3_dir, prompts)
    engine.drafter = FaultyDrafter({tuple(p): e for p, e in zip(prompts, expected)}, "nan_probs", every=2)
    engine.gamma = 4
    with caplog.at_level("WARNING", logger="dspark.drafter_guard"):
        assert run_staggered(engine, prompts) == expected
    assert engine.stats.drafter_failures > 1
    assert [r.getMessage()[:24] for r in caplog.records] == ["drafter scripted failed:"]


def test_each_kind_of_bad_proposal_is_named():
    from dspark.drafter_guard import DrafterGuard
    from dspark.stats import EngineStats

    guard = DrafterGuard(vocab_size=8, max_failures=3, stats=EngineStats())
    request = DraftRequest("r", [1, 2], 2, None, None)
    q = torch.full((2, 8), 1 / 8)
    cases = {
        "fine": DraftProposal([3, 4], probs=q, confidence=torch.tensor([0.9, 0.5])),
        "tokens outside vocab": DraftProposal([3, 8]),
        "too long": DraftProposal([3, 4, 5]),
        "q wrong shape": DraftProposal([3, 4], probs=torch.full((2, 9), 1 / 9)),
        "nan q": DraftProposal([3, 4], probs=torch.full((2, 8), math.nan)),
        "negative q": DraftProposal([3, 4], probs=q - 0.5),
        "nan confidence": DraftProposal([3, 4], confidence=torch.tensor([0.9, math.nan])),
        "confidence above 1": DraftProposal([3, 4], confidence=torch.tensor([0.9, 1.5])),
        "short confidence": DraftProposal([3, 4], confidence=torch.tensor([0.9])),
        "not a proposal": [3, 4],
    }
    problems = dict(zip(cases, guard._problems([request] * len(cases), list(cases.values()))))
    assert problems == {
        "fine": None,
        "tokens outside vocab": "token ids outside [0, 8)",
        "too long": "3 tokens for 2 slots",
        "q wrong shape": "draft probabilities of shape (2, 9), expected (2, 8)",
        "nan q": "draft probabilities are not finite values in [0, 1]",
        "negative q": "draft probabilities are not finite values in [0, 1]",
        "nan confidence": "confidences are not finite values in [0, 1]",
        "confidence above 1": "confidences are not finite values in [0, 1]",
        "short confidence": "confidences of shape (1,) for 2 tokens",
        "not a proposal": "got a list, not a DraftProposal",
    }
