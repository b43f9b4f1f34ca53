"""bench/sim_work.py: a seeded trace that simulates the same thing every run (its digest), and a
baseline that simulates nothing (what callgrind's count of the trace is taken less)."""

from __future__ import annotations

from bench.sim_work import main


def test_a_trace_repeats_to_the_digest_and_the_baseline_simulates_nothing():
    args = ["--replicas", "3", "--duration", "1"]
    first, again = main(args), main(args)
    assert first["events"] > 0 and first["requests"] > 0
    assert first["digest"] == again["digest"]
    assert main([*args, "--load", "0.5"])["digest"] != first["digest"]
    assert main(["--replicas", "3", "--duration", "0"]) == {"events": 0}
