"""bench/gate_trace.py --sim: the validation's trace, one part, on a simulated replica of the measured CPU
profile, with the gate's drafting rounds logged as the served engine's are."""

from __future__ import annotations

import json

from bench.gate_trace import main


def test_the_simulated_engines_gate_is_traced_on_the_validations_trace(qwen3_dir, tmp_path, capsys):
    # Any target's tokenizer cuts the held-out prompts (the demo target is not built in tests).
    (tmp_path / "target").symlink_to(qwen3_dir)
    out = tmp_path / "rounds.jsonl"
    main(["--models", str(tmp_path), "--part", "1", "--seconds", "8", "--sim", "--out", str(out)])
    summary = capsys.readouterr().out.splitlines()
    words = summary[0].replace(",", "").split()
    requests, steps, gated, drafted = (int(words[i]) for i in (1, 3, 5, 8))
    assert requests > 5 and steps > gated > 0 and drafted > 0
    rounds = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rounds) == drafted
    # Rounds that folded a backlog (the first folds the prompts) time nothing: until a steady round has
    # timed the drafter the gate cannot weigh it; from then on every round's state says whether it pays.
    assert rounds[0]["state"]["draft_s"] is None and rounds[0]["pays"] is None
    assert all((r["pays"] is None) == (r["state"]["draft_s"] is None) for r in rounds)
    assert any(r["pays"] is not None for r in rounds)
    assert all(r["requests"] >= 1 and 0 <= r["accepted"] <= r["verified"] for r in rounds)
    assert summary[1].startswith("healed table, ms per forward:")
