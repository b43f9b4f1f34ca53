"""EngineStats.prefill_steps and the other prefill_step_* counters: the steps that ran a prompt chunk,
apart, with their part of the step time, forward tokens and rounds (sim/step_fit.py fits the two kinds
of step apart)."""

from __future__ import annotations

import pytest

from dspark import Engine, EngineConfig
from dspark.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)


def test_steps_that_ran_a_prompt_chunk_are_counted_apart_with_their_tokens_and_rounds(qwen3_dir):
    engine = Engine(EngineConfig(model=str(qwen3_dir), drafter="none", max_num_seqs=4, num_kv_pages=32))
    stats = engine.stats
    engine.add_request([1, 2, 3], GREEDY)
    engine.step()  # its prefill alone: 3 tokens, no round
    assert (stats.prefill_steps, stats.prefill_step_forward_tokens, stats.prefill_step_rounds) == (1, 3, 0)
    assert stats.prefill_step_time_s == stats.step_time_s > 0
    engine.step()  # a decode step: not a prefill step
    assert (stats.steps, stats.prefill_steps) == (2, 1)
    engine.add_request([4, 5, 6, 7, 8], GREEDY)
    before_tokens, before_time, before_prefill = (
        stats.forward_tokens,
        stats.step_time_s,
        stats.prefill_step_time_s,
    )
    engine.step()  # the first request's round beside the second's prefill: a prefill step with a round
    assert (stats.prefill_steps, stats.prefill_step_rounds) == (2, 1)
    assert stats.prefill_step_forward_tokens == 3 + (stats.forward_tokens - before_tokens) == 3 + 1 + 5
    assert stats.prefill_step_time_s - before_prefill == pytest.approx(
        stats.step_time_s - before_time, abs=1e-12
    )
    while engine.has_unfinished():
        engine.step()
    counters = stats.to_dict()
    assert counters["prefill_steps"] == 2 and counters["prefill_step_rounds"] == 1
    assert counters["prefill_step_forward_tokens"] == 9 and counters["steps"] > 2
    assert counters["prefill_step_time_s"] < counters["step_time_s"]
    assert counters["prompt_chunks"] == 2  # each prompt in one chunk
