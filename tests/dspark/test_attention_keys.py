"""EngineStats.attention_keys: each forward's requests times its longest context (dspark/attention.py pads
every request's keys to the longest), summed, and its prefill steps' part apart (the simulator's profile
prices a step's padded keys, sim/attention.py, and its fit reads this counter, sim/step_fit.py)."""

from __future__ import annotations

from dspark import Engine, EngineConfig
from dspark.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)


def test_a_forward_counts_its_requests_times_its_longest_context(qwen3_dir):
    engine = Engine(EngineConfig(model=str(qwen3_dir), drafter="none", max_num_seqs=4, num_kv_pages=32))
    stats = engine.stats
    engine.add_request([1, 2, 3], GREEDY)
    engine.step()  # its prefill: one request, 3 tokens from position 0: 3 keys, 3 queries
    assert (stats.attention_keys, stats.attention_query_keys) == (3, 9)
    engine.step()  # its first decode token at position 3: keys 0..3, one query
    assert (stats.attention_keys, stats.attention_query_keys) == (3 + 4, 9 + 4)
    engine.add_request([4, 5, 6, 7, 8, 9, 10, 11], GREEDY)
    engine.step()  # its token at position 4 (5 keys, 1 query) beside an 8-token prompt: both padded to 8 x 8
    assert (stats.attention_keys, stats.attention_query_keys) == (7 + 2 * 8, 13 + 2 * 8 * 8)
    engine.step()  # decode only: positions 5 and 8, padded to 9 keys, one query each
    assert (stats.attention_keys, stats.attention_query_keys) == (23 + 2 * 9, 141 + 2 * 9)
    assert (stats.prefill_step_attention_keys, stats.prefill_step_attention_query_keys) == (3 + 16, 9 + 128)
    counters = stats.to_dict()
    assert (counters["attention_keys"], counters["attention_query_keys"]) == (41, 159)
    assert (counters["prefill_step_attention_keys"], counters["prefill_step_attention_query_keys"]) == (
        19,
        137,
    )
