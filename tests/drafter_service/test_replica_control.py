"""What a replica tells the cluster controller and applies from it (deployments/replica_control.py), on a real
engine with the tiny trained DSpark drafter: the tap's acceptance by position against an independent count,
STS temperatures pushed live (confidences change, greedy output stays the target's), the cost table
rescaled."""

from __future__ import annotations

import pytest

from deployments.replica_control import RoundTap, rescale_cost_table, set_sts_temperatures, sts_temperatures
from dspark import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
# No draft gate: on a CPU it may decline drafting, and these tests need rounds that draft.
OPTIONS = dict(
    num_kv_pages=128, cost_table_profile="coarse", max_num_seqs=4, num_speculative_tokens=4, draft_gate=False
)
PROMPTS = ["def parse(text):", "import bisect\n", "class Wrapper:", "The river"]


@pytest.fixture(scope="module")
def expected(stack):
    return [o.token_ids for o in LLM(str(stack), num_kv_pages=128).generate(PROMPTS, GREEDY)]


def test_the_tap_counts_acceptance_by_position_and_samples_rounds(stack):
    llm = LLM(str(stack), drafter="dspark", scheduler="fixed", **OPTIONS)
    tap, rounds = RoundTap(llm.engine.gamma), []
    llm.engine.round_observers.append(tap.observe)
    llm.engine.round_observers.append(lambda seq, p, n, verdict: rounds.append((n, verdict.num_accepted)))
    llm.generate(PROMPTS, GREEDY)
    reading = tap.read()
    drafted = [(n, a) for n, a in rounds if n > 0]
    assert reading["window_rounds"] == len(drafted)
    assert reading["window_verified"] == sum(n for n, _ in drafted) == llm.engine.stats.drafted_tokens
    for k, alpha in enumerate(reading["acceptance_by_position"]):
        reached = [a for n, a in drafted if n > k and a >= k]
        assert alpha == pytest.approx(sum(a > k for a in reached) / len(reached))
    assert len(reading["rounds_sample"]) == len(drafted)
    for survival, _accepted, temperature in reading["rounds_sample"]:
        assert all(b <= a + 1e-6 for a, b in zip(survival, survival[1:])) and temperature == 0.0
    assert set(reading["tpot_by_class"]) == {""} and reading["tpot_by_class"][""] > 0
    assert tap.read()["window_rounds"] == 0  # each read starts a fresh window


def test_the_tap_times_output_tokens_per_sla_class(stack):
    llm = LLM(str(stack), drafter="dspark", scheduler="fixed", **OPTIONS)
    ticks = iter(range(10_000))
    tap = RoundTap(llm.engine.gamma, clock=lambda: float(next(ticks)))  # one second per round observed
    llm.engine.round_observers.append(tap.observe)
    chat = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, sla_class="chat")
    llm.generate(PROMPTS[:2], [chat, GREEDY])
    tpot = tap.read()["tpot_by_class"]
    # Two requests share every step: a request waits at most two ticks per round for 1 + accepted tokens.
    assert set(tpot) == {"chat", ""} and all(0 < t <= 2.0 for t in tpot.values())


def test_sts_pushed_live_changes_confidences_not_output(stack, expected):
    llm = LLM(str(stack), drafter="dspark", scheduler="dspark", **OPTIONS)
    seen = []
    llm.engine.round_observers.append(lambda seq, p, n, verdict: seen.append(p.confidence))
    assert [o.token_ids for o in llm.generate(PROMPTS[:1], GREEDY)] == expected[:1]
    before = next(c for c in seen if c is not None)
    block = llm.engine.drafter.block_size
    in_force = set_sts_temperatures(llm.engine, {0.0: [4.0] * block})
    assert in_force["0.0"] == [4.0] * block and sts_temperatures(llm.engine) == in_force
    seen.clear()
    assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == expected  # lossless
    after = next(c for c in seen if c is not None)
    assert not (after[:1] == before[:1]).all()  # same first slot, flattened toward 1/2
    with pytest.raises(ValueError, match="holds 2 values"):
        set_sts_temperatures(llm.engine, {0.0: [1.0, 1.0]})


def test_the_cost_table_is_rescaled_everywhere(stack):
    llm = LLM(str(stack), drafter="dspark", scheduler="dspark", **OPTIONS)
    table = llm.engine.cost_table
    before = [table(b) for b in (1, 8, table.max_tokens)]
    rescaled = rescale_cost_table(llm.engine, 2.0)
    assert [table(b) for b in (1, 8, table.max_tokens)] == pytest.approx([r / 2 for r in before])
    assert rescaled[0][1] == pytest.approx(table.smoothed[0], abs=1e-3)
    with pytest.raises(ValueError, match="positive"):
        rescale_cost_table(llm.engine, 0.0)
