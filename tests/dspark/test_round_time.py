"""EngineStats.round_time_s / round_tokens: a step as its decoding requests live it, summed over their
rounds, with the serving loop's time between busy steps counted in (the SLA router calibrates its TPOT
by them: deployments/replica_state.py RecentRounds, router/signals.py decode_calibration)."""

from __future__ import annotations

import time

import dspark.engine
from dspark import Engine, EngineConfig
from dspark.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


def test_rounds_count_their_steps_wall_time_and_decode_tokens_and_the_wait_between_steps(
    qwen3_dir, monkeypatch
):
    engine = Engine(EngineConfig(model=str(qwen3_dir), drafter="none", max_num_seqs=4, num_kv_pages=32))
    # A clock the test moves on between steps: time the serving loop would spend between them.
    shift = [0.0]
    monkeypatch.setattr(dspark.engine.time, "perf_counter", lambda: time.perf_counter_ns() / 1e9 + shift[0])
    stats = engine.stats
    for prompt in ([1, 2, 3], [4, 5, 6, 7]):
        engine.add_request(prompt, GREEDY)
    engine.step()  # both prompts prefill: no decoding request, no round
    assert (stats.rounds, stats.round_time_s, stats.round_tokens) == (0, 0.0, 0)
    step_s = stats.step_time_s
    shift[0] += 10.0  # ten seconds pass before the next step, with both requests waiting for it
    engine.step()  # both decode: one anchor each, no drafter
    assert stats.rounds == 2 and stats.round_tokens == 2 * 2
    between = stats.round_time_s / 2 - (stats.step_time_s - step_s)  # each waited the gap and the step
    assert 10.0 <= between < 10.5
    # Idle in between (nothing left to run): the wait before the next request's steps is not counted.
    while engine.has_unfinished():
        engine.step()
    before = stats.round_time_s
    shift[0] += 100.0
    engine.add_request([8, 9], GREEDY)
    engine.step()  # its prefill
    steps_s = stats.step_time_s
    engine.step()  # its first round
    assert stats.round_time_s - before < 100.0
    assert stats.round_time_s - before >= stats.step_time_s - steps_s
