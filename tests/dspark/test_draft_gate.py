"""The draft gate: skips drafting when earlier rounds say it does not pay, re-probes, stays lossless."""

from __future__ import annotations

from test_drafters import ScriptedDrafter

from dspark import SamplingParams
from dspark.config import EngineConfig
from dspark.cost_table import CostTable
from dspark.draft_gate import DraftGate
from dspark.engine import Engine

# A target whose step time grows with the tokens verified: 1 token 100 steps/s, 8 tokens 50.
SPS = CostTable([1, 8, 64], [100.0, 50.0, 10.0], 64)


def test_gate_compares_drafting_with_plain_decoding():
    gate = DraftGate()
    assert gate.should_draft(4, SPS)  # nothing measured yet: draft and measure
    for _ in range(2):  # the first round folds the prompts; the second is timed
        gate.record(True, num_requests=4, accepted=12, verified=16, draft_seconds=0.002)
    # 4 requests x (1 + 3) tokens per ~15 ms step beats 4 tokens per 10 ms.
    assert gate.should_draft(4, SPS)
    expensive = DraftGate()
    expensive.record(True, num_requests=4, accepted=2, verified=16, draft_seconds=0.04)
    assert expensive.should_draft(4, SPS) and expensive.draft_s is None  # not timed yet: draft again
    expensive.record(True, num_requests=4, accepted=2, verified=16, draft_seconds=0.04)
    assert not expensive.should_draft(4, SPS)
    for _ in range(expensive.probe_every - 1):
        expensive.record(False, 4, 0, 0, 0.0)
        assert not expensive.should_draft(4, SPS)
    expensive.record(False, 4, 0, 0, 0.0)
    assert expensive.should_draft(4, SPS)  # the periodic probe


def test_gated_engine_stays_token_identical_and_probes(qwen3_dir):
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    prompts = [[5, 6, 7, 8] * 4, [9, 3, 1] * 5]
    plain = Engine(EngineConfig(model=str(qwen3_dir), num_kv_pages=64, kv_page_size=8))
    expected = {}
    for i, p in enumerate(prompts):
        plain.add_request(p, params, request_id=str(i))
    while plain.has_unfinished():
        expected.update({o.request_id: o.token_ids for o in plain.step() if o.finished})

    engine = Engine(
        EngineConfig(
            model=str(qwen3_dir),
            scheduler="dspark",
            num_speculative_tokens=4,
            num_kv_pages=64,
            kv_page_size=8,
            cost_table_ema=0.0,
        ),
        drafter=ScriptedDrafter({tuple(p): expected[str(i)] for i, p in enumerate(prompts)}, gamma=4),
        cost_table=SPS,
    )
    # Earlier rounds measured a drafter far too slow for what it gains: the gate closes.
    for _ in range(2):
        engine.draft_gate.record(True, num_requests=2, accepted=1, verified=8, draft_seconds=1.0)
    for i, p in enumerate(prompts):
        engine.add_request(p, params, request_id=str(i))
    outputs = {}
    while engine.has_unfinished():
        outputs.update({o.request_id: o.token_ids for o in engine.step() if o.finished})
    assert outputs == expected
    assert engine.stats.gated_rounds > 0
    assert engine.stats.drafted_tokens > 0  # the probe rounds still drafted
    # Why, in the engine's stats: what the gate measured and when it probes next.
    gate = engine.stats.to_dict()["draft_gate"]
    assert gate == engine.draft_gate.to_dict() and gate["draft_s"] is not None
    assert gate["probe_every"] >= engine.draft_gate.min_probe_every and 0 <= gate["gain"] <= gate["verified"]
    no_gate = Engine(EngineConfig(model=str(qwen3_dir), num_kv_pages=64, kv_page_size=8, draft_gate=False))
    assert no_gate.stats.to_dict()["draft_gate"] is None


def test_probes_back_off_while_they_confirm_and_reset_when_drafting_pays():
    gate = DraftGate()
    for _ in range(2):
        gate.record(True, num_requests=4, accepted=2, verified=16, draft_seconds=0.04)
    waits = []
    for _ in range(3):
        rounds = 0
        while not gate.should_draft(4, SPS):
            gate.record(False, 4, 0, 0, 0.0)
            rounds += 1
        waits.append(rounds)
        gate.record(True, 4, accepted=2, verified=16, draft_seconds=0.04, sps=SPS)  # the probe
        assert gate.should_draft(4, SPS)  # folded a backlog: the next round drafts to be timed
        gate.record(True, 4, accepted=2, verified=16, draft_seconds=0.04, sps=SPS)  # ... and confirms
    assert waits == [16, 32, 64]
    while not gate.should_draft(4, SPS):
        gate.record(False, 4, 0, 0, 0.0)
    for _ in range(10):  # the drafter got cheap and good: the probe finds it pays, back to short waits
        gate.record(True, 4, accepted=20, verified=24, draft_seconds=0.0004, sps=SPS)
    assert gate.probe_every == gate.min_probe_every and gate.should_draft(4, SPS)


def test_a_round_that_folds_a_backlog_counts_its_gains_not_its_time():
    """The probe after declined rounds folds their context too (block drafters fold lazily): timing it
    would price drafting at the backlog's cost and confirm every decline by itself."""
    gate = DraftGate()
    for _ in range(2):
        gate.record(True, num_requests=1, accepted=3, verified=7, draft_seconds=0.003, sps=SPS)
    steady = gate.draft_s
    assert steady == 0.003
    gate.declined = gate.probe_every  # a long decline, then the probe folds all of it
    assert gate.should_draft(1, SPS)
    gate.record(True, num_requests=1, accepted=3, verified=7, draft_seconds=0.5, sps=SPS)
    assert gate.draft_s == steady and gate.should_draft(1, SPS)  # its 0.5 s is not the drafter's cost
    gate.record(True, num_requests=1, accepted=3, verified=7, draft_seconds=0.003, sps=SPS)
    assert gate.draft_s == steady and gate.probe_every == gate.min_probe_every
