"""sim/step_fit.py: the step terms fitted to engine runs recover known terms exactly, the costs stay
non-negative (the token term, a correction, may not), and refuse runs that cannot tell the terms apart;
the fitted forward_scale times the simulated step."""

from __future__ import annotations

import dataclasses

import pytest

from dspark.cost_table import CostTable
from sim.replica import SimReplica
from sim.step_fit import (
    EngineRun,
    cpu_over_model,
    fit_draft_terms,
    fit_forward_scale,
    fit_step_terms,
    forward_ratios,
    model_s,
    nonnegative_least_squares,
    reshape_rates,
)
from sim.workload import Request
from tests.sim.test_simulator import small_profile

# Steps per second, falling with the tokens in a step (the table is isotonic: it would pool a rise).
TABLE = CostTable([1, 4, 16, 64, 256], [700.0, 600.0, 400.0, 150.0, 45.0], 256, source="given")
TERMS = {
    "forward_scale": 0.85,
    "step_overhead_s": 0.0021,
    "request_overhead_s": 0.00065,
    "token_overhead_s": 0.00004,
}
# (steps, forward tokens, decoding requests summed over steps): mean tokens per step are whole numbers
# (the model takes the table at whole tokens), and tokens and requests per step vary apart.
SHAPES = [(400, 800, 400), (300, 1200, 600), (250, 2000, 1000), (200, 2400, 1200), (200, 4800, 800)]


# An engine run that counted its 10 prefill steps apart from its 90 decode steps (dspark/stats.py).
SPLIT_RUN = {
    "steps": 100,
    "forward_tokens": 900.0,
    "rounds": 150.0,
    "engine_cpu_s": 0.5,
    "step_time_s": 0.5,
    "prefill_steps": 10,
    "prefill_step_time_s": 0.1,
    "prefill_step_forward_tokens": 600.0,
    "prefill_step_rounds": 10.0,
}


def runs_from(terms: dict[str, float], shapes=SHAPES) -> list[EngineRun]:
    out = []
    for steps, tokens, rounds in shapes:
        shape = EngineRun(steps, tokens, rounds, 0.0)
        out.append(EngineRun(steps, tokens, rounds, steps * model_s(shape, TABLE, terms)))
    return out


def test_runs_made_by_known_terms_give_those_terms_back():
    fitted = fit_step_terms(runs_from(TERMS), TABLE)
    assert fitted == pytest.approx(TERMS, rel=1e-9)
    assert cpu_over_model(runs_from(TERMS), TABLE, fitted) == pytest.approx([1.0] * len(SHAPES), rel=1e-12)


def test_a_run_is_one_point_at_its_mean_step():
    run = EngineRun(steps=100, forward_tokens=400, rounds=250, cpu_s=1.0)
    assert (run.tokens_per_step, run.requests_per_step) == (4.0, 2.5)
    assert model_s(run, TABLE, TERMS) == pytest.approx(0.85 / 600 + 0.0021 + 2.5 * 0.00065 + 4 * 0.00004)


def test_runs_cheaper_per_token_than_the_table_give_a_negative_token_term_and_keep_the_others():
    """Runs cheaper per token than the table says (the table is timed on verify-shaped steps; a served
    prompt chunk's tokens cost less each): the token term, a correction of the table's price per token,
    comes out negative and the other terms are recovered. The other terms are costs and stay >= 0: runs
    that would make the per-request term negative get it at 0 and the rest refitted."""
    truth = {**TERMS, "token_overhead_s": 0.0}
    runs = runs_from(truth)
    assert fit_step_terms(runs, TABLE) == pytest.approx(truth, abs=1e-12)
    cheaper = [
        EngineRun(r.steps, r.forward_tokens, r.rounds, r.cpu_s - 0.00002 * r.forward_tokens) for r in runs
    ]
    assert fit_step_terms(cheaper, TABLE) == pytest.approx({**truth, "token_overhead_s": -0.00002}, abs=1e-12)
    fewer = [EngineRun(r.steps, r.forward_tokens, r.rounds, r.cpu_s - 0.001 * r.rounds) for r in runs]
    fitted = fit_step_terms(fewer, TABLE)
    assert fitted["request_overhead_s"] == 0.0
    assert min(v for k, v in fitted.items() if k != "token_overhead_s") >= 0.0


def test_the_forward_term_is_kept_where_the_overheads_could_absorb_it():
    """Four noisy runs (a --quick smoke's sweep on a loaded machine: (1/SPS, 1, requests, tokens) per step
    against plain CPU per step): the fit free of the forward prices it at 0 and lets the overheads take
    it, a profile whose forward costs nothing (and whose draft gate, on the table's clock, divides by it);
    kept in, the forward is priced, at a slightly larger error."""
    rows = [
        [0.0084912026936948, 1.0, 0.8620689655172413, 3.3448275862068964],
        [0.0084912026936948, 1.0, 0.875, 2.84375],
        [0.010011191611214092, 1.0, 1.5555555555555556, 5.055555555555555],
        [0.015635618172731756, 1.0, 1.5, 26.666666666666668],
    ]
    y = [0.013711331285423787, 0.012809054390211105, 0.01443747150481401, 0.01995550926461701]
    free = nonnegative_least_squares(rows, y, "requests and tokens")
    assert free[0] == 0.0 and free[1] > 0
    kept = nonnegative_least_squares(rows, y, "requests and tokens", required=(0,))
    assert kept == pytest.approx([0.566684637, 0.008129913, 0.0, 0.000111746], rel=1e-5, abs=1e-12)

    def error(c):
        return sum((t - sum(a * b for a, b in zip(r, c))) ** 2 for r, t in zip(rows, y))

    assert error(free) < error(kept)
    with pytest.raises(ValueError, match="no fit with positive terms"):
        nonnegative_least_squares([[1.0, 1.0], [2.0, 1.0]], [0.0, 0.0], "requests", required=(0,))


def test_a_profile_whose_forward_costs_nothing_is_refused():
    with pytest.raises(ValueError, match="forward_scale must be positive"):
        small_profile(forward_scale=0.0)


def test_runs_at_one_prompt_shape_cannot_tell_requests_from_tokens_and_are_refused():
    same_shape = [(100, 200 * k, 100 * k) for k in (1, 2, 3, 4)]  # two tokens per decoding request
    with pytest.raises(ValueError, match="vary requests and tokens per step"):
        fit_step_terms(runs_from(TERMS, same_shape), TABLE)
    with pytest.raises(ValueError, match="at least 4 runs"):
        fit_step_terms(runs_from(TERMS)[:3], TABLE)


def test_a_runs_drafting_is_taken_out_at_the_engines_cpu_share_of_its_steps_wall():
    """Engine threads on a CPU for 80% of their steps' wall time: of 0.5 s spent drafting, 0.4 s was CPU.
    Runs carrying that on top of known plain steps still give the plain terms back."""
    runs = []
    for steps, tokens, rounds in SHAPES:
        plain = steps * model_s(EngineRun(steps, tokens, rounds, 0.0), TABLE, TERMS)
        cpu = plain + 0.4
        counters = {"steps": steps, "forward_tokens": tokens, "rounds": rounds, "engine_cpu_s": cpu}
        runs.append(EngineRun.from_counters({**counters, "step_time_s": cpu / 0.8, "draft_time_s": 0.5}))
    assert [r.draft_cpu_s for r in runs] == pytest.approx([0.4] * len(SHAPES), rel=1e-12)
    assert fit_step_terms(runs, TABLE) == pytest.approx(TERMS, rel=1e-9)
    older = EngineRun.from_counters({"steps": 10, "forward_tokens": 10, "rounds": 10, "engine_cpu_s": 1.0})
    assert older.draft_cpu_s == 0.0 and older.plain_cpu_s == 1.0


def test_the_drafters_terms_are_fitted_to_runs_that_draft_every_round():
    """Drafting 2.5 ms a step plus 0.8 ms a request, at 1, 2.5 and 4 requests per step."""
    runs = [
        EngineRun(steps, 0, steps * n, 1.0, draft_cpu_s=steps * (0.0025 + 0.0008 * n))
        for steps, n in ((400, 1.0), (200, 2.5), (100, 4.0))
    ]
    assert fit_draft_terms(runs) == pytest.approx(
        {"draft_s_per_step": 0.0025, "draft_s_per_request": 0.0008}, rel=1e-9
    )
    with pytest.raises(ValueError, match="vary requests per step"):
        fit_draft_terms([EngineRun(100, 0, 200, 1.0, 0.5), EngineRun(50, 0, 100, 1.0, 0.25)])


def test_forward_scale_times_the_step_and_the_gate_weighs_drafting_on_the_tables_clock():
    """The step's forward runs at forward_scale of the table's time; the draft gate sees the drafting in
    the table's units (the engine's gate compares its drafting with a table healed to its own forwards),
    so the same profile at another forward_scale decides the same and only runs faster."""

    def first_step(scale: float):
        replica = SimReplica("r", small_profile(forward_scale=scale, draft_s_per_request=0.001))
        for rid in range(3):
            req = Request(rid, 0.0, 16, 40, "standard", "easy")
            assert replica.admit(req) is None
        replica.complete(replica.plan(), 0.0)  # the prompts
        plan = replica.plan()
        replica.complete(plan, 0.0)
        replica.complete(replica.plan(), 0.0)  # the gate times the round after the one folding the prompts
        return plan, replica.gate.draft_s

    (full, full_draft), (half, half_draft) = first_step(1.0), first_step(0.5)
    assert (half.lengths, half.tokens) == (full.lengths, full.tokens) and full.drafting
    assert half.forward_seconds == pytest.approx(full.forward_seconds / 2, rel=1e-12)
    assert half.seconds == pytest.approx(full.seconds - full.forward_seconds / 2, rel=1e-12)
    assert half_draft == pytest.approx(2 * full_draft, rel=1e-12) and full_draft > 0


def test_a_healing_table_heals_from_the_forwards_wall_time_and_the_gate_times_drafting_in_wall_time():
    """With heal_table the replica decides on its own copy of the table, healed bucket by bucket from
    what the engine times as its forward (runner.forward alone, at its wall time: a step that runs 1.5x
    longer than alone heals its bucket 1.5x slower; the step's overheads and its drafting are outside
    the engine's timer), and its gate times the drafting at its wall time, on that table's clock, as the
    engine's gate does. The modelled step time and the profile's shared table are untouched."""
    profile = small_profile(
        forward_scale=0.5,
        draft_s_per_request=0.001,
        step_overhead_s=0.002,
        request_overhead_s=0.001,
        heal_table=True,
        heal_rate=0.5,
    )
    replica = SimReplica("r", profile)
    assert replica.table is not replica.model_table and replica.model_table is profile.cost_table()
    req = Request(0, 0.0, 16, 200, "standard", "easy")
    assert replica.admit(req) is None
    plans = []
    for _ in range(40):
        plan = replica.plan()
        plan.stretch, plan.seconds = 1.5, plan.seconds * 1.5  # what the cluster does as a step starts
        replica.complete(plan, 0.0)
        plans.append(plan)
    fixed = profile.cost_table()
    assert fixed.rates == list(profile.sps_rates) and fixed.observations == 0
    assert replica.table.observations == 40
    # Its last steps take alike (one request verifying 6-7 drafts, where the table is flat): the bucket
    # they fall in has healed to their forward at 1.5x its time alone, overheads and drafting left out.
    last = plans[-1]
    assert last.drafting and last.seconds == plans[-2].seconds == plans[-3].seconds
    assert last.forward_seconds == pytest.approx(0.5 / fixed(last.tokens), rel=1e-12)
    assert 1.0 / replica.table(last.tokens) == pytest.approx(1.5 * last.forward_seconds, rel=1e-2)
    # Its stats carry the healed table, as a real replica's do (the router predicts from it).
    assert replica.published_table == [
        [b, round(r, 3)] for b, r in zip(replica.table.points, replica.table.smoothed)
    ]
    assert replica.published_table[0][1] > profile.sps_rates[0]  # its bucket: 0.5 x 1.5 of the table's time
    timed = [p for p in plans if p.drafting][1:]  # the first drafting round folded the prompt: not timed
    assert replica.gate.draft_s is not None and timed
    assert replica.gate.draft_s == pytest.approx(1.5 * (0.0005 + 0.001), rel=0.05)


def test_a_run_whose_engine_counted_its_prefill_steps_apart_is_two_points_that_fit_its_two_kinds():
    """Runs each made of alike decode steps (a few tokens over a few requests) and a few alike prefill
    steps (a prompt chunk beside one round) by known terms, the CPU split by the steps' wall: as two
    points each (split_counters) they give the terms back exactly; as single points at their mean step
    (priced by the table at a size neither kind is) they do not. Engines on a CPU for 80% of the wall,
    drafting in decode steps only."""
    counters, decode_steps = [], []
    # (decode steps, their tokens, requests), (prefill steps, their tokens) per run
    for (n_d, t_d, r_d), (n_p, t_p) in [
        ((300, 2, 2), (10, 16)),
        ((200, 4, 2), (30, 64)),
        ((400, 3, 3), (5, 32)),
        ((150, 8, 4), (50, 128)),
        ((250, 6, 6), (20, 64)),
    ]:
        step_d = model_s(EngineRun(1, t_d, r_d, 0.0), TABLE, TERMS)
        step_p = model_s(EngineRun(1, t_p, 1, 0.0), TABLE, TERMS)
        decode_steps.append(((t_d, r_d), step_d))
        cpu = n_d * step_d + n_p * step_p
        counters.append(
            {
                "steps": n_d + n_p,
                "forward_tokens": t_d * n_d + t_p * n_p,
                "rounds": r_d * n_d + n_p,
                "engine_cpu_s": cpu + 0.4,
                "step_time_s": (cpu + 0.4) / 0.8,
                "draft_time_s": 0.5,
                "prefill_steps": n_p,
                "prefill_step_time_s": n_p * step_p / 0.8,
                "prefill_step_forward_tokens": t_p * n_p,
                "prefill_step_rounds": n_p,
                "prefill_step_draft_time_s": 0.0,
            }
        )
    points = [p for c in counters for p in EngineRun.split_counters(c)]
    assert len(points) == 10
    prefills, decodes = points[0::2], points[1::2]
    assert [p.requests_per_step for p in prefills] == [1.0] * 5 and all(p.draft_cpu_s == 0 for p in prefills)
    assert [(d.tokens_per_step, d.requests_per_step) for d in decodes] == [k for k, _ in decode_steps]
    assert [d.draft_cpu_s for d in decodes] == pytest.approx([0.4] * 5, rel=1e-12)
    assert fit_step_terms(points, TABLE) == pytest.approx(TERMS, rel=1e-9)
    # Fitted to the runs' means instead, the terms come out otherwise and price the decode steps off.
    means = fit_step_terms([EngineRun.from_counters(c) for c in counters], TABLE)
    priced = [model_s(EngineRun(1, t, r, 0.0), TABLE, means) / step for (t, r), step in decode_steps]
    assert max(abs(x - 1) for x in priced) > 0.01
    # Without the counters, or with no step of one kind, the run stays one point.
    plain = {k: v for k, v in counters[0].items() if not k.startswith("prefill_step")}
    assert EngineRun.split_counters(plain) == [EngineRun.from_counters(plain)]
    none = {**counters[0], "prefill_steps": 0}
    assert EngineRun.split_counters(none) == [EngineRun.from_counters(none)]


def test_a_profile_whose_negative_token_term_makes_a_step_free_is_refused():
    from sim.profiles import load

    profile = load("cpu_measured")
    assert profile.token_overhead_s < 0  # the committed fit's correction
    largest = profile.sps_points[-1]
    free = -(profile.forward_scale / profile.sps_rates[-1] + profile.step_overhead_s) / largest
    with pytest.raises(ValueError, match="makes a step of [0-9]+ tokens free"):
        dataclasses.replace(profile, token_overhead_s=free)


def test_forward_scale_comes_from_the_engines_forward_timers_and_the_overheads_from_the_rest():
    """Runs whose engines timed their forward at 1.3 x the table: fit_forward_scale reads 1.3 from the
    timers (from_counters: the forward's wall at the CPU share of the steps' wall), and the overheads
    fitted on the CPU less that forward come back. The CPU alone would split the same steps otherwise
    once they are noisy; without timers there is no scale."""
    truth = {**TERMS, "forward_scale": 1.3}
    runs = [
        dataclasses.replace(r, forward_cpu_s=r.steps * 1.3 * step_fit_forward(r)) for r in runs_from(truth)
    ]
    scale = fit_forward_scale(runs, TABLE)
    assert scale == pytest.approx(1.3, rel=1e-12)
    assert fit_step_terms(runs, TABLE, scale) == pytest.approx(truth, rel=1e-9)
    assert fit_forward_scale(runs_from(truth), TABLE) is None
    counters = {"steps": 10, "forward_tokens": 10, "rounds": 10, "engine_cpu_s": 1.0, "step_time_s": 4.0}
    assert EngineRun.from_counters({**counters, "forward_time_s": 2.0}).forward_cpu_s == pytest.approx(0.5)
    assert EngineRun.from_counters(counters).forward_cpu_s is None


def test_the_fit_weighs_each_point_by_its_steps_so_the_fitted_steps_add_up_to_the_runs_cpu():
    """Noisy runs (each point's CPU off the model by up to 10 %): weighted by steps, the fitted model's
    CPU over all steps is the runs' CPU (the constant term's normal equation), which the unweighted fit
    of the same points misses."""
    noisy = [
        dataclasses.replace(r, cpu_s=r.cpu_s * f)
        for r, f in zip(runs_from(TERMS), (1.1, 0.95, 1.04, 0.9, 1.08))
    ]
    noisy[0] = dataclasses.replace(
        noisy[0], steps=4000, forward_tokens=8000, rounds=4000, cpu_s=noisy[0].cpu_s * 10
    )
    for scale in (None, 0.85):
        fitted = fit_step_terms(noisy, TABLE, scale)
        modelled = sum(r.steps * model_s(r, TABLE, fitted) for r in noisy)
        assert modelled == pytest.approx(sum(r.plain_cpu_s for r in noisy), rel=1e-9)
    x = [[step_fit_forward(r), 1.0, r.requests_per_step, r.tokens_per_step] for r in noisy]
    plain = dict(
        zip(TERMS, nonnegative_least_squares(x, [r.plain_cpu_s / r.steps for r in noisy], "", (0,), (3,)))
    )
    unweighted = sum(r.steps * model_s(r, TABLE, plain) for r in noisy)
    assert unweighted != pytest.approx(sum(r.plain_cpu_s for r in noisy), rel=1e-3)


def step_fit_forward(run: EngineRun) -> float:
    from sim.step_fit import forward_s

    return forward_s(run, TABLE)


def test_a_table_whose_shape_parts_from_the_timed_forward_is_reshaped_to_it():
    """The start-up table flat over 1-16 tokens where the engines timed their forward rising with the
    tokens (4, 5, 6, 8 ms at 2, 4, 8, 16 tokens a step): one scale over the flat table overprices the
    small steps and underprices the large ones (the ratios part from 1 both ways); the table reshaped to
    the timers' ratios (interpolated in tokens between the runs, held beyond them) prices each run's
    forward as timed, its scale then 1."""
    flat = CostTable([1, 2, 4, 8, 16, 64], [200.0, 200.0, 200.0, 200.0, 200.0, 50.0], 64, source="given")
    timed = {2: 0.004, 4: 0.005, 8: 0.006, 16: 0.008}
    runs = [EngineRun(100, 100 * b, 100, 1.0, forward_cpu_s=100 * s) for b, s in timed.items()]
    scale = fit_forward_scale(runs, flat)
    ratios = forward_ratios(runs, flat, scale)
    assert [b for b, _ in ratios] == [2, 4, 8, 16]
    assert ratios[0][1] < 1 < ratios[-1][1]
    rates = reshape_rates(flat.points, flat.rates, ratios)
    # At the runs' steps the reshaped table is the timed forward at that scale; below and above them the
    # end ratios hold (the 1-token point takes the 2-token run's, the 64-token one the 16-token run's).
    for b, seconds in timed.items():
        assert scale / rates[flat.points.index(b)] == pytest.approx(seconds, rel=1e-6)
    assert rates[0] == pytest.approx(rates[1], rel=1e-6)
    assert rates[-1] == pytest.approx(50.0 / ratios[-1][1], rel=1e-5)
    reshaped = CostTable(flat.points, rates, 64, source="given")
    assert fit_forward_scale(runs, reshaped) == pytest.approx(scale, rel=1e-6)
    assert all(r == pytest.approx(1.0, rel=1e-6) for _, r in forward_ratios(runs, reshaped, scale))


def test_a_term_per_prompt_chunk_is_fitted_where_the_runs_count_their_chunks():
    """Runs whose steps pay 0.46 ms per prompt chunk beside the other terms: with the engines'
    prompt_chunks counter the fit gives the chunk term back with the others; without it the other terms
    alone (the chunks' cost then falls on them)."""
    truth = {**TERMS, "forward_scale": 1.3, "chunk_overhead_s": 0.00046}
    chunked = [(1.0, 40.0), (1.4, 60.0), (0.5, 30.0), (2.0, 20.0), (0.0, 10.0)]  # (chunks, cpu scale)
    runs = []
    for (steps, tokens, rounds), (per_step, _) in zip(SHAPES, chunked):
        shape = EngineRun(steps, tokens, rounds, 0.0, chunks=per_step * steps)
        cpu = steps * model_s(shape, TABLE, truth)
        runs.append(
            dataclasses.replace(shape, cpu_s=cpu, forward_cpu_s=steps * 1.3 * step_fit_forward(shape))
        )
    assert fit_step_terms(runs, TABLE, 1.3) == pytest.approx(truth, rel=1e-9)
    uncounted = [dataclasses.replace(r, chunks=None) for r in runs]
    assert "chunk_overhead_s" not in fit_step_terms(uncounted, TABLE, 1.3)
    # A run's chunks all fall in its prefill steps' point.
    counters = {**SPLIT_RUN, "prompt_chunks": 14}
    prefill, decode = EngineRun.split_counters(counters)
    assert (prefill.chunks, decode.chunks, prefill.chunks_per_step) == (14, 0.0, 1.4)
    assert EngineRun.from_counters({k: v for k, v in counters.items() if k != "prompt_chunks"}).chunks is None


def test_a_profile_prices_each_prompt_chunk_of_a_step():
    profile = small_profile(chunk_overhead_s=0.0005)
    table = profile.cost_table()
    assert profile.step_seconds(64, 2, 0, table, None, 3) - profile.step_seconds(
        64, 2, 0, table
    ) == pytest.approx(0.0015)
    assert profile.scaled(2.0).chunk_overhead_s == pytest.approx(0.00025)


def test_a_replicas_prompt_chunks_each_cost_the_profiles_chunk_overhead():
    from sim.replica import SimReplica
    from tests.sim.test_attention import request

    plans = []
    for overhead in (0.0, 0.002):
        replica = SimReplica(
            "r0", small_profile(chunk_overhead_s=overhead), scheduler="dspark", draft_gate=False
        )
        for i in range(3):
            assert replica.admit(request(i, 40)) is None
        plans.append(replica.plan())  # the three prompts in one step
    assert len(plans[1].chunks) == 3
    assert plans[1].seconds - plans[0].seconds == pytest.approx(3 * 0.002)
