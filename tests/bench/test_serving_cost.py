"""bench/serving_cost.py's accounting: a replica's threads split into its engine thread and the rest, and
where the engine's stepping time went (on a CPU, waiting for one, blocked)."""

from __future__ import annotations

from bench.serving_cost import ENGINE_COUNTERS, engine_time, split_engine


def test_each_replicas_busiest_thread_is_its_engine_and_only_that_threads_run_delay_is_kept():
    spent = {
        "proxy": 1.0,
        "tid:10/1": 5.0,
        "tid:10/2": 1.0,
        "wait:10/1": 2.0,
        "wait:10/2": 9.0,
        "tid:20/7": 0.5,
        "tid:20/8": 4.0,
        "wait:20/7": 3.0,
        "wait:20/8": 0.25,
    }
    assert split_engine(spent) == {
        "proxy": 1.0,
        "engine": 9.0,
        "replica_other": 1.5,
        "engine_run_delay": 2.25,
    }


def test_a_steps_wall_time_is_the_engines_cpu_its_wait_for_a_cpu_and_the_rest_blocked():
    before = dict.fromkeys(ENGINE_COUNTERS, 0)
    after = {**before, "steps": 100, "step_time_s": 10.0, "rounds": 300, "forward_tokens": 400}
    spent = {"engine": 4.0, "engine_run_delay": 5.5, "replica_other": 0.5}
    run = engine_time(after, before, spent)
    assert (run["steps"], run["rounds"], run["forward_tokens"]) == (100, 300, 400)
    assert (run["engine_cpu_s"], run["engine_run_delay_s"], run["engine_blocked_s"]) == (4.0, 5.5, 0.5)
    assert run["replica_other_cpu_s"] == 0.5
