"""A step's padded attention (sim/attention.py): its law against the engine's own table shape, its place in
the profile and the replica's steps, its fit to a measurement, and the fit of the step terms over it."""

from __future__ import annotations

import dataclasses
import json
import math
from types import SimpleNamespace

import pytest

from bench.attention_cost import block, fit, plot
from dspark.cost_table import ProfileShape, _time_forward
from sim.attention import AttentionCost
from sim.profiles import from_dict
from sim.replica import SimReplica
from sim.step_fit import EngineRun, fit_forward_scale, forward_ratios
from sim.workload import Request
from tests.sim.test_simulator import simulate, small_profile

ATTENTION = AttentionCost(
    s_per_key=2e-6, s_per_query_key=5e-8, table_context=256, table_gamma=7, table_max_seqs=16
)


@pytest.mark.parametrize("tokens", [1, 5, 8, 9, 40, 130, 256])
def test_the_tables_keys_are_those_the_engine_profiles_its_table_on(tokens):
    """table_keys follows dspark.cost_table._time_forward's dummy requests (requests x longest context)."""
    seen = []
    recorder = SimpleNamespace(
        kv=SimpleNamespace(num_pages=10_000), forward=lambda items, taps: seen.extend(items)
    )
    shape = ProfileShape(tokens, 16, 7, 256, 16, "float32", "cpu")
    _time_forward(recorder, shape, tokens)
    assert sum(len(i.token_ids) for i in seen) == tokens
    keys = len(seen) * max(i.start + len(i.token_ids) for i in seen)
    assert ATTENTION.table_padding(tokens) == (keys, keys * max(len(i.token_ids) for i in seen))


def test_a_step_costs_its_padding_beyond_the_tables_and_nothing_at_the_tables_own():
    assert ATTENTION.extra_s(8, *ATTENTION.table_padding(8)) == 0.0
    keys, query_keys = ATTENTION.table_padding(8)  # one request of 8 tokens at 256: 264 keys, 8 x 264
    assert (keys, query_keys) == (264, 8 * 264)
    assert ATTENTION.extra_s(8, 8 * 400, 8 * 400) == pytest.approx(2e-6 * (3200 - 264) + 5e-8 * (3200 - 2112))
    assert (
        ATTENTION.extra_s(8, 8 * 20, 8 * 20) < 0
    )  # shorter contexts than the table's: cheaper than it prices
    for bad in (
        dict(s_per_key=-1e-9),
        dict(s_per_query_key=-1e-9),
        dict(table_context=-1),
        dict(table_max_seqs=0),
    ):
        with pytest.raises(ValueError, match="attention"):
            dataclasses.replace(ATTENTION, **bad)


def test_the_profile_prices_a_forward_by_its_padding_at_its_forward_scale():
    profile = small_profile(attention=ATTENTION, forward_scale=1.5)
    table = profile.cost_table()
    plain = profile.forward_seconds(16, table)
    assert plain == pytest.approx(1.5 / 100.0)
    assert profile.forward_seconds(16, table, ATTENTION.table_padding(16)) == pytest.approx(plain)
    long = profile.forward_seconds(16, table, (2 * 500, 2 * 500 * 8))
    assert long == pytest.approx(1.5 * (1 / 100.0 + ATTENTION.extra_s(16, 1000, 8000)))
    step = profile.step_seconds(16, 2, 0, table, (2 * 500, 2 * 500 * 8))
    assert step - profile.step_seconds(16, 2, 0, table) == pytest.approx(long - plain)
    # Twice as fast a replica pays half for its padding too.
    assert profile.scaled(2.0).attention.s_per_key == pytest.approx(1e-6)
    assert profile.scaled(2.0).attention.s_per_query_key == pytest.approx(2.5e-8)
    # A price that would make some forward free is refused.
    with pytest.raises(ValueError, match="free"):
        small_profile(attention=dataclasses.replace(ATTENTION, s_per_key=1e-4))


def test_the_profile_file_carries_the_block():
    data = {
        "name": "t",
        "sps": {"points": [1, 64], "rates": [100.0, 100.0]},
        "max_num_batched_tokens": 64,
        "max_num_seqs": 16,
        "kv_pages": 64,
        "page_size": 16,
        "gamma": 7,
        "acceptance": {"easy": [0.9] * 7},
        "attention": {**dataclasses.asdict(ATTENTION), "source": "a measurement"},
    }
    assert from_dict(data).attention == ATTENTION
    assert from_dict({k: v for k, v in data.items() if k != "attention"}).attention is None


def request(rid: int, prompt: int, out: int = 32) -> Request:
    return Request(
        rid=rid, arrival=0.0, prompt_tokens=prompt, max_tokens=out, sla_class="standard", domain="easy"
    )


def stepped(prompts: list[int], attention: AttentionCost | None) -> tuple[SimReplica, list]:
    """A replica given these prompts, stepped until all decode; the plans of its next three steps."""
    replica = SimReplica("r0", small_profile(attention=attention), scheduler="dspark", draft_gate=False)
    for i, n in enumerate(prompts):
        assert replica.admit(request(i, n)) is None
    now = 0.0
    while not all(s.decoding for s in replica.seqs.values()):
        plan = replica.plan()
        now += plan.seconds
        replica.complete(plan, now)
    plans = []
    for _ in range(3):
        plan = replica.plan()
        plans.append((plan, [s.computed for s in plan.decoding]))
        now += plan.seconds
        replica.complete(plan, now)
    return replica, plans


def test_a_replicas_step_pays_for_its_longest_context_across_its_requests():
    short, _ = stepped([40, 40, 40], ATTENTION)
    padded, plans = stepped([40, 40, 200], ATTENTION)
    for plan, computed in plans:
        longest = max(c + 1 + n for c, n in zip(computed, plan.lengths))
        assert (plan.keys, plan.query_keys) == (3 * longest, 3 * longest * (1 + max(plan.lengths)))
        priced = short.profile.forward_seconds(plan.tokens, short.model_table, (plan.keys, plan.query_keys))
        assert plan.forward_seconds == pytest.approx(priced)
    assert padded.counters.attention_keys > 3 * 200 * padded.counters.steps // 2
    # One long request makes every step of its batch dearer: the short ones wait on it.
    mean = [r.counters.forward_time_s / r.counters.steps for r in (short, padded)]
    assert mean[1] > mean[0]
    # Without the block a step is priced by its tokens alone, and no keys are counted.
    plain, plans = stepped([40, 40, 200], None)
    assert plain.counters.attention_keys == plain.counters.attention_query_keys == 0
    assert all(p.keys == p.query_keys == 0 for p, _ in plans)


def test_a_prompt_chunk_pads_its_batchs_queries():
    """A prompt chunk beside decoding requests: every request's queries padded to the chunk's tokens."""
    replica = SimReplica("r0", small_profile(attention=ATTENTION), scheduler="dspark", draft_gate=False)
    assert replica.admit(request(0, 40)) is None
    plan = replica.plan()
    replica.complete(plan, plan.seconds)
    assert replica.admit(request(1, 100)) is None
    plan = replica.plan()  # the first request decodes beside the second's whole prompt
    assert [n for _, n in plan.chunks] == [100]
    assert (plan.keys, plan.query_keys) == (2 * 100, 2 * 100 * 100)


def test_in_the_cluster_attention_conserves_tokens_and_slows_long_batches():
    plain, plain_requests = simulate(profile=small_profile())
    priced, requests = simulate(profile=small_profile(attention=ATTENTION))
    assert {r.outcome for r in requests} <= {"done", "shed", "refused"}
    assert all(r.generated == r.max_tokens for r in requests if r.outcome == "done")
    replicas = priced.all_replicas()
    assert all(r.counters.attention_keys > 0 for r in replicas if r.counters.steps)
    assert [r.finish for r in requests] != [r.finish for r in plain_requests]


def test_the_fit_recovers_the_prices_within_each_batch_shape():
    points = []
    for b, n, base in ((1, 1, 2e-3), (8, 1, 4e-3), (8, 8, 7e-3), (4, 48, 12e-3)):
        for c in (32, 96, 192, 384):
            keys = b * (c + n)
            forward = base + 1.5e-6 * keys + 4e-8 * keys * n
            points.append(
                {"requests": b, "tokens_each": n, "context": c, "keys": keys, "forward_ms": 1e3 * forward}
            )
        if b > 1:
            longest = points[-1]["forward_ms"]
            points.append({"requests": b, "tokens_each": n, "context": "mixed", "forward_ms": 0.9 * longest})
    fitted = fit(points)
    assert fitted["s_per_key"] == pytest.approx(1.5e-6, rel=1e-6)
    assert fitted["s_per_query_key"] == pytest.approx(4e-8, rel=1e-6)
    assert fitted["r2"] == 1.0 and fitted["r2_keys_alone"] < 1.0
    assert [m["over_longest"] for m in fitted["mixed"]] == [0.9] * 3
    slopes = {(s["requests"], s["tokens_each"]): s["us_per_key"] for s in fitted["by_shape"]}
    assert slopes[8, 1] == pytest.approx(1.54) and slopes[4, 48] == pytest.approx(3.42)  # 1.5 + n x 0.04
    result = {
        "command": "python bench/attention_cost.py",
        "started": "2026-12-06T17:00:00Z",
        "points": points,
        "table_shape": {"context_len": 256, "gamma": 7, "max_seqs": 16},
        "fit": fitted,
    }
    made = block(result)
    assert AttentionCost.from_json(made) == AttentionCost(1.5e-6, 4e-8, 256, 7, 16)
    assert "2026-12-06T17:00:00Z" in made["source"]
    with pytest.raises(ValueError, match="vary"):
        fit([p for p in points if p["context"] in (32, "mixed")])


def test_the_plot_is_written(tmp_path):
    points = [
        {"requests": 4, "tokens_each": 1, "context": c, "keys": 4 * (c + 1), "forward_ms": 3 + c / 100}
        for c in (32, 384)
    ]
    result = {"points": points, "fit": {"s_per_key": 2.5e-6, "s_per_query_key": 1e-8}}
    plot(result, tmp_path / "a.png")
    assert (tmp_path / "a.png").stat().st_size > 1000


def test_the_step_fit_prices_each_runs_keys_so_the_forward_scale_is_the_tables():
    """Runs whose engines timed forwards of 1.2 x (the table + their keys' price): with the keys priced
    (the engine's attention_keys counter) the fit reads 1.2 and the timers match at every run, where the
    table alone reads a scale between and a shape that is the runs' contexts."""
    table = lambda b: 1000.0 / (1 + b / 20)  # noqa: E731
    shapes = [(10_000, 1.5, 1.5, 150), (10_000, 6.0, 6.0, 3000), (5_000, 3.0, 2.0, 300)]
    counters = []
    for steps, tokens, rounds, keys in shapes:
        forward = 1.2 * (1 / table(round(tokens)) + ATTENTION.extra_s(round(tokens), keys, 2 * keys))
        counters.append(
            {
                "steps": steps,
                "forward_tokens": tokens * steps,
                "rounds": rounds * steps,
                "engine_cpu_s": steps * (forward + 0.002),
                "step_time_s": steps * (forward + 0.002),
                "forward_time_s": steps * forward,
                "attention_keys": keys * steps,
                "attention_query_keys": 2 * keys * steps,
            }
        )
    priced = [EngineRun.from_counters(c, ATTENTION) for c in counters]
    assert fit_forward_scale(priced, table) == pytest.approx(1.2, rel=1e-9)
    assert all(r == pytest.approx(1.0) for _, r in forward_ratios(priced, table, 1.2))
    plain = [EngineRun.from_counters(c) for c in counters]
    ratios = [r for _, r in forward_ratios(plain, table, fit_forward_scale(plain, table))]
    assert max(ratios) - min(ratios) > 0.2
    # Without the counter (an engine before it), the key price is not applied.
    old = {k: v for k, v in counters[0].items() if not k.startswith("attention")}
    assert EngineRun.from_counters(old, ATTENTION).attention_s == 0.0


def test_a_runs_prefill_and_decode_steps_each_carry_their_own_keys():
    from tests.sim.test_step_fit import SPLIT_RUN

    run = {
        **SPLIT_RUN,
        "attention_keys": 30_000,
        "attention_query_keys": 900_000,
        "prefill_step_attention_keys": 12_000,
        "prefill_step_attention_query_keys": 840_000,
    }
    prefill, decode = EngineRun.split_counters(run, ATTENTION)
    assert prefill.attention_s == pytest.approx(ATTENTION.extra_s(60, 1200, 84_000))
    assert decode.attention_s == pytest.approx(ATTENTION.extra_s(round(300 / 90), 18_000 / 90, 60_000 / 90))
    assert all(p.attention_s == 0.0 for p in EngineRun.split_counters(run))


def test_the_committed_profile_carries_the_committed_measurements_block():
    from bench.cost_profile import ATTENTION as MEASURED
    from sim.profiles import load

    measured = json.loads(MEASURED.read_text())
    made = block(measured)
    assert load("cpu_measured").attention == AttentionCost.from_json(made)
    assert math.isclose(made["s_per_key"], measured["fit"]["s_per_key"], rel_tol=1e-6)
    assert math.isclose(made["s_per_query_key"], measured["fit"]["s_per_query_key"], rel_tol=1e-6)
    assert load("gpu_dsv4flash_rocm").attention is None  # the GPU class's forward is not this padded one
