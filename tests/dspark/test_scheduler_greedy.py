"""Every scheduler mode keeps greedy output token-identical to plain decoding under concurrency, and
the draft budget changes while requests run (engine loop and AsyncEngine.call)."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
from test_drafters import ScriptedDrafter
from test_engine_greedy import GREEDY, prompts_of_mixed_length, reference, run_staggered

from dspark import AsyncEngine
from dspark.config import SCHEDULERS, EngineConfig
from dspark.cost_table import CostTable
from dspark.draft_budget import DraftBudget
from dspark.draft_gate import DraftGate
from dspark.engine import Engine
from dspark.sequence import Status
from dspark.verify_policy import VerifyRound

MAX_TOKENS = 36


def confidence(slot: int, previous: int) -> float:
    """Scripted, token-dependent confidences spread over [0.3, 1]."""
    return 0.3 + 0.7 * ((previous * 37 + slot * 11) % 10) / 9


def steep_table() -> CostTable:
    # Flat up to 12 tokens, then a steep fall: an idle batch verifies long windows, a full one prunes.
    rates = [100.0 if b <= 12 else 100.0 * 0.93 ** (b - 12) for b in range(1, MAX_TOKENS + 1)]
    return CostTable(list(range(1, MAX_TOKENS + 1)), rates, MAX_TOKENS)


def scheduled_engine(model_dir, prompts, expected, mode: str, **options) -> Engine:
    config = EngineConfig(
        model=str(model_dir),
        scheduler=mode,
        draft_gate=False,  # every round drafts: these tests exercise the verify-length choice itself
        num_speculative_tokens=4,
        max_num_seqs=6,
        max_num_batched_tokens=MAX_TOKENS,
        kv_page_size=8,
        num_kv_pages=96,
        cost_table_ema=0.0,  # the injected table stays as written, so lengths are reproducible
        **options,
    )
    drafter = ScriptedDrafter(
        {tuple(p): e for p, e in zip(prompts, expected)}, gamma=4, confidence=confidence
    )
    return Engine(config, drafter=drafter, cost_table=steep_table())


class Recorder:
    """Wraps a policy and keeps every round it saw with the lengths it chose."""

    def __init__(self, inner) -> None:
        self.inner, self.rounds = inner, []

    def choose(self, round_: VerifyRound) -> list[int]:
        lengths = self.inner.choose(round_)
        self.rounds.append((round_, lengths))
        return lengths


class DraftingCosts(DraftGate):
    """A gate that always drafts, whose measured drafting is 20 ms a request (a step of the steep table
    is 10 ms): what the walk adds to each round with verify_counts_drafting."""

    def __init__(self) -> None:
        super().__init__(ema=0.0, gain=1.0, draft_s=0.02)

    def should_draft(self, num_requests, sps) -> bool:
        return True


@pytest.mark.parametrize(
    "mode, whole_rounds", [(m, False) for m in SCHEDULERS] + [("dspark", True), ("pipelined", True)]
)
def test_every_mode_is_greedy_identical(qwen3_dir, mode, whole_rounds):
    prompts = prompts_of_mixed_length(384)
    expected = reference(qwen3_dir, prompts)
    engine = scheduled_engine(qwen3_dir, prompts, expected, mode, verify_counts_drafting=whole_rounds)
    if whole_rounds:
        engine.draft_gate = engine.stats.draft_gate = DraftingCosts()
    engine.policy = recorder = Recorder(engine.policy)

    assert run_staggered(engine, prompts) == expected
    stats = engine.stats
    assert engine.pages.num_free_pages == engine.pages.num_pages
    chosen = [n for _, lengths in recorder.rounds for n in lengths]
    windows = [w for round_, _ in recorder.rounds for w in round_.windows]
    assert stats.verify_length_hist == [chosen.count(n) for n in range(max(chosen) + 1)]
    assert sum(stats.verify_length_hist) == stats.rounds
    if mode == "plain":
        assert stats.drafted_tokens == 0 and set(windows) == {0}
    elif mode == "mtp1":
        assert max(windows) == 1 and stats.accepted_tokens > 0
    elif mode == "fixed":
        assert chosen == windows  # never pruned: 6 x 5 tokens fit the 36-token step
    else:
        # The scheduler really chose: some windows were cut, some verified in full.
        pairs = list(zip(chosen, windows))
        assert any(n < w for n, w in pairs) and any(0 < n == w for n, w in pairs)
        assert stats.accepted_tokens > 0
        assert 0 < stats.predicted_accepted_tokens and stats.realised_accepted_tokens == stats.accepted_tokens


def test_pipelined_sees_only_round_t_minus_2(qwen3_dir):
    prompts = prompts_of_mixed_length(384)
    expected = reference(qwen3_dir, prompts)
    engine = scheduled_engine(qwen3_dir, prompts, expected, "pipelined")
    engine.policy = recorder = Recorder(engine.policy)
    assert run_staggered(engine, prompts) == expected
    rounds = [round_ for round_, _ in recorder.rounds if round_.windows]  # steps with decoding requests
    assert len(rounds) > 10
    for t, round_ in enumerate(rounds):
        assert round_.history == (None if t < 2 else [row or [] for row in rounds[t - 2].survival])


def test_budget_changes_while_requests_run(qwen3_dir):
    prompts = prompts_of_mixed_length(384)
    expected = reference(qwen3_dir, prompts)
    engine = scheduled_engine(qwen3_dir, prompts, expected, "dspark")
    engine.policy = recorder = Recorder(engine.policy)
    budget = DraftBudget(max_step_tokens=3, max_request_tokens=2, max_request_tokens_by_class={"batch": 0})
    for i, p in enumerate(prompts):
        engine.add_request(p, replace(GREEDY, sla_class="batch" if i % 2 else None), request_id=str(i))
    results, decoding = {}, []  # decoding: per step, the requests the policy saw, in its order
    while engine.has_unfinished():
        if len(decoding) == 6:
            engine.set_draft_budget(budget)
        decoding.append([s.request_id for s in engine.seqs.values() if s.status is Status.DECODE])
        results.update({o.request_id: o.token_ids for o in engine.step() if o.finished})
    assert [results[str(i)] for i in range(len(prompts))] == expected
    before, after = recorder.rounds[:6], recorder.rounds[6:]
    assert any(sum(lengths) > 3 or max(lengths, default=0) > 2 for _, lengths in before)  # it bites
    for (round_, lengths), ids in zip(after, decoding[6:]):
        assert round_.step_cap <= 3 and sum(lengths) <= 3 and max(lengths, default=0) <= 2
        assert all(w == 0 for w, rid in zip(round_.windows, ids) if int(rid) % 2)  # class "batch"
    assert any(sum(lengths) > 0 for _, lengths in after)  # the others kept verifying
    assert engine.stats.to_dict()["draft_budget"] == budget.to_dict()


def test_async_engine_call_sets_budget(qwen3_dir):
    prompts = prompts_of_mixed_length(384)
    expected = reference(qwen3_dir, prompts)
    async_engine = AsyncEngine(engine=scheduled_engine(qwen3_dir, prompts, expected, "pipelined"))
    budget = DraftBudget(max_request_tokens=1)

    async def main():
        stream = async_engine.generate(prompts[0], GREEDY)
        tokens = (await anext(stream)).delta_token_ids
        async_engine.call(lambda e: e.set_draft_budget(budget))
        async for out in stream:
            tokens += out.delta_token_ids
        return tokens

    try:
        assert asyncio.run(main()) == expected[0]
        assert async_engine.call(lambda e: e.stats.to_dict()["draft_budget"]) == budget.to_dict()
    finally:
        async_engine.shutdown()


def test_step_time_limit_chunks_prefill_and_keeps_greedy_identity(qwen3_dir):
    """max_step_s cuts the prefill beside decoding requests to what the table times within it (at least
    one KV page); the prompts then take more steps, and the tokens stay exactly the target's."""
    prompts = prompts_of_mixed_length(384)
    expected = reference(qwen3_dir, prompts)
    limit = 1.25 / 100.0  # steep_table: 10 ms up to 12 tokens, then x 1/0.93 a token: B <= 15 fits
    fits = max(b for b in range(1, MAX_TOKENS + 1) if 1.0 / steep_table()(b) <= limit)
    assert fits == 15

    def run(budget: DraftBudget) -> tuple[list, list[tuple[int, int, int]]]:
        engine = scheduled_engine(qwen3_dir, prompts, expected, "dspark")
        engine.set_draft_budget(budget)
        steps = []  # (decoding tokens, prefill tokens, prompt tokens waiting)
        batch = engine._batch

        def recorded(decoding, proposals, lengths, prefilling, total):
            items, chunks = batch(decoding, proposals, lengths, prefilling, total)
            decode = len(decoding) + sum(lengths)
            waiting = sum(len(s.prompt_token_ids) - s.num_computed for s in prefilling)
            steps.append((decode, sum(len(i.token_ids) for i in items) - decode, waiting))
            return items, chunks

        engine._batch = recorded
        return run_staggered(engine, prompts), steps

    free, free_steps = run(DraftBudget())
    limited, steps = run(DraftBudget(max_step_s=limit))
    assert free == expected and limited == expected
    page = 8
    # Without the limit some step carried more prefill beside decoding requests than the limit allows.
    assert any(d > 0 and p > max(fits - d, page) for d, p, _ in free_steps)
    for decode, prefill, waiting in steps:
        room = MAX_TOKENS - decode
        allowed = room if decode == 0 else min(room, max(fits - decode, page))
        assert prefill == min(waiting, allowed)
    assert len(steps) > len(free_steps)
