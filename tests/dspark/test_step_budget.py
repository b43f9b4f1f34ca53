"""The step's prefill budget from a step-time limit (dspark/step_budget.py) on hand-built tables, and the
DraftBudget field that carries the limit."""

from __future__ import annotations

import pytest

from dspark.cost_table import CostTable
from dspark.draft_budget import DraftBudget
from dspark.errors import InvalidRequestError
from dspark.step_budget import prefill_tokens

# 10 ms at one token, 20 ms at 512, 40 ms at 1024, 80 ms at 2048 (rates interpolate linearly between).
TABLE = CostTable([1, 512, 1024, 2048], [100.0, 50.0, 25.0, 12.5], 2048)


def test_no_limit_leaves_the_engines_budget():
    assert prefill_tokens(TABLE, 100, None, 2048, 16) == 1948
    assert prefill_tokens(TABLE, 2048, None, 2048, 16) == 0


def test_the_largest_prefill_whose_step_the_table_times_within_the_limit():
    # 20 ms is the table's time at B = 512 exactly; at 513 the rate is under 50.
    assert prefill_tokens(TABLE, 100, 0.02, 2048, 16) == 412
    assert prefill_tokens(TABLE, 300, 0.02, 2048, 16) == 212
    assert prefill_tokens(TABLE, 100, 0.04, 2048, 16) == 924  # B = 1024
    assert prefill_tokens(TABLE, 100, 1.0, 2048, 16) == 1948  # the limit never binds: the engine's cap


def test_the_floor_keeps_prompts_moving_and_never_exceeds_the_room():
    # The decoding tokens alone take 40 ms: past a 20 ms limit, so only the floor runs.
    assert prefill_tokens(TABLE, 1024, 0.02, 2048, 16) == 16
    assert prefill_tokens(TABLE, 2040, 0.02, 2048, 16) == 8  # 8 tokens of room left
    assert prefill_tokens(TABLE, 100, 0.02, 2048, 1000) == 1000  # a floor above the fit wins


def test_a_step_without_decoding_requests_takes_the_whole_room():
    assert prefill_tokens(TABLE, 0, 0.02, 2048, 16) == 2048


def test_the_result_is_exactly_the_boundary_on_every_limit():
    for decode in (1, 37, 400, 900):
        for limit_ms in range(10, 45):
            limit = limit_ms / 1000
            p = prefill_tokens(TABLE, decode, limit, 2048, 16)
            room = 2048 - decode
            assert p == room or 1.0 / TABLE(decode + p + 1) > limit
            assert p == min(16, room) or 1.0 / TABLE(decode + p) <= limit


def test_draft_budget_carries_the_step_time_limit():
    budget = DraftBudget.from_dict({"max_request_tokens": 3, "max_step_s": 0.05})
    assert budget.max_step_s == 0.05 and not budget.unlimited
    assert budget.to_dict()["max_step_s"] == 0.05
    assert DraftBudget.from_dict(budget.to_dict()) == budget
    assert DraftBudget().to_dict()["max_step_s"] is None
    for bad in (0, -0.1, float("inf"), float("nan"), True, "0.05"):
        with pytest.raises(InvalidRequestError) as exc:
            DraftBudget(max_step_s=bad)
        assert exc.value.field == "max_step_s"
