"""bench/serving_cost.py's accounting: a replica's threads split into its engine thread and the rest,
where the engine's stepping time went (on a CPU, waiting for one, blocked), and the profile's step terms
fitted to its engine sweep."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.cost_profile import (
    derive_profile,
    host_check,
    open_loop_beyond,
    path_beyond,
    path_load_fit,
    provenance,
    run_rates,
)
from bench.serving_cost import (
    ENGINE_COUNTERS,
    arrival_run,
    engine_time,
    parse_sweep,
    serving_path,
    split_engine,
    sweep_label,
    ttft_split,
)
from sim.profiles import from_dict
from sim.step_fit import EngineRun, model_s, nonnegative_least_squares


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


def test_the_engine_sweep_is_given_as_concurrency_x_prompt_tokens():
    assert parse_sweep("2x48,12x48,8x144") == ((2, 48), (12, 48), (8, 144))
    assert sweep_label(8, 144) == "engine_c8_p144"


def test_write_profile_fits_the_step_and_drafter_terms_to_the_sweeps_over_the_replicas_table():
    """A measurement whose sweep runs were made by known step terms over a given table, and whose
    gate-off runs drafted at known drafter terms (engine threads on a CPU for half their steps' wall): the
    derived profile carries that table, those terms and sources naming the sweeps; the rest is derived as
    without the sweeps."""
    root = Path(__file__).resolve().parents[2]
    measured = json.loads((root / "bench" / "results" / "serving_cost.json").read_text())
    serve = json.loads((root / "bench" / "results" / "serve_proxy.json").read_text())
    profile = json.loads((root / "sim" / "profiles" / "cpu_measured.json").read_text())
    table = {
        "path": "/cache/sps-0123.json",
        "points": [1, 8, 64, 1024],
        "rates": [120.0, 100.0, 40.0, 4.0],
        "fingerprint": {"hardware": {"threads": 1}},
    }
    terms = {
        "forward_scale": 0.9,
        "step_overhead_s": 0.0031,
        "request_overhead_s": 0.00072,
        "token_overhead_s": 0.000013,
    }
    drafter = {"draft_s_per_step": 0.0042, "draft_s_per_request": 0.0011}
    cost = from_dict({**profile, "sps": {"points": table["points"], "rates": table["rates"]}}).cost_table()
    steps = {}
    for (c, p), (n, tokens, rounds) in {
        (2, 48): (900, 2700, 900),
        (8, 48): (500, 3000, 2000),
        (12, 48): (400, 4400, 2400),
        (8, 144): (500, 6000, 1500),
    }.items():
        cpu = n * model_s(EngineRun(n, tokens, rounds, 0.0), cost, terms)
        counters = {"steps": n, "forward_tokens": tokens, "rounds": rounds, "drafted_tokens": 7}
        steps[sweep_label(c, p)] = {**counters, "engine_cpu_s": cpu}
    for c, (n, rounds) in {2: (800, 800), 8: (400, 1400)}.items():
        draft_cpu = n * drafter["draft_s_per_step"] + rounds * drafter["draft_s_per_request"]
        counters = {"steps": n, "forward_tokens": 3 * rounds, "rounds": rounds, "drafted_tokens": 2 * rounds}
        run = {**counters, "engine_cpu_s": 3 * draft_cpu, "draft_time_s": 2 * draft_cpu}
        steps[sweep_label(c, 48, "draft")] = {**run, "step_time_s": 6 * draft_cpu}
    serving = {
        **measured["serving"],
        "engine_steps": steps,
        "engine_sweep": [k for k in steps if k.startswith("engine")],
        "draft_sweep": [k for k in steps if k.startswith("draft")],
        "sps_table": table,
    }

    # The made-up sweep runs record no wall time, so host_check (and the path's remainder, path_beyond)
    # and the path's load fit leave them out: the profile without them is derived without the committed
    # runs too.
    without = {"ttft_split": {}, "engine_sweep": [], "arrival_runs": {}}
    plain = derive_profile(profile, {**measured["serving"], **without}, serve, measured["command"])
    fitted = derive_profile(profile, serving, serve, measured["command"])
    assert {k: fitted[k] for k in terms} == pytest.approx(terms, abs=1e-9)
    assert {k: fitted[k] for k in drafter} == pytest.approx(drafter, abs=1e-9)
    assert fitted["sps"] == {"points": table["points"], "rates": table["rates"]}
    assert fitted["sps_fingerprint"] == table["fingerprint"]
    changed = {k for k in fitted if fitted[k] != plain[k]}
    assert changed == {"sps", "sps_fingerprint", "sources", *terms, *drafter}
    fitted_sources = ("SPS(B)", "engine overhead per step", "drafter cost per step")
    (step_source,) = [s for s in fitted["sources"] if s.startswith("engine overhead per step")]
    assert "engine_c2_p48, engine_c8_p48, engine_c12_p48, engine_c8_p144" in step_source
    assert "never the validation's trace" in step_source and "1.000, 1.000, 1.000, 1.000" in step_source
    assert "drafted 28 of 16100 forward tokens" in step_source
    assert "drafting took 0.0% of their CPU" in step_source
    (draft_source,) = [s for s in fitted["sources"] if s.startswith("drafter cost per step")]
    assert "draft_c2_p48, draft_c8_p48" in draft_source and "4.2 ms + 1.1 ms x N" in draft_source
    (sps_source,) = [s for s in fitted["sources"] if s.startswith("SPS(B)")]
    assert "sps-0123.json" in sps_source
    kept = [s for s in fitted["sources"] if not s.startswith(fitted_sources)]
    assert kept == [s for s in plain["sources"] if not s.startswith(fitted_sources)]
    assert len(kept) == len(fitted["sources"]) - 3


def test_an_open_loop_runs_requests_keep_their_order_and_number_their_replicas_as_they_appear():
    def record(sent: float, replica: str | None, spans=(0.001, 0.002)) -> dict:
        return {"sent": sent, "ttft": 0.05, "end": 0.5, "inbound": 0.01, "spans": spans, "replica": replica}

    records = [record(0.2, "zz9"), record(0.1, "aa1"), record(0.3, "zz9", None), record(0.4, None)]
    run = arrival_run(2.0, 40.0, records)
    rows = [dict(zip(run["columns"], row)) for row in run["requests"]]
    assert [r["sent_s"] for r in rows] == [0.2, 0.1, 0.3, 0.4]  # as dealt their prompts, not re-sorted
    assert [r["replica"] for r in rows] == [0, 1, 0, None]
    assert (rows[0]["first_token_s"], rows[0]["end_s"], rows[0]["queue_s"]) == (0.25, 0.7, 0.001)
    assert rows[2]["queue_s"] is None and rows[2]["prefill_s"] is None


def test_the_serving_path_is_the_mean_ttft_less_the_engines_mean_step_per_request():
    path = serving_path([0.040, 0.050, 0.036, 0.034], {"steps": 4, "step_time_s": 0.048})
    assert path == {
        "requests": 4,
        "engine_steps": 4,
        "ttft_s": 0.04,
        "engine_step_s": 0.012,
        "request_path_s": 0.028,
    }


def test_with_each_requests_timing_the_path_is_its_ttft_less_its_own_engine_part():
    """Four one-token requests: TTFT 40, 50, 36, 34 ms at the client; at their replicas 4 ms queue and
    10, 12, 8, 6 ms prefill: the serving path is 40 - 13 = 27 ms, not TTFT less the step wall."""
    ttfts = [0.040, 0.050, 0.036, 0.034]
    spans = [(0.004, 0.010), (0.004, 0.012), (0.004, 0.008), (0.004, 0.006)]
    split = ttft_split(ttfts, spans)
    assert split == {
        "requests": 4,
        "ttft_s": 0.04,
        "queue_s": 0.004,
        "prefill_s": 0.009,
        "engine_s": 0.013,
        "path_s": 0.027,
    }
    path = serving_path(ttfts, {"steps": 4, "step_time_s": 0.048}, split)
    assert path["request_path_s"] == 0.027 and path["engine_s"] == 0.013 and path["engine_step_s"] == 0.012
    # A request without timing (an older replica) leaves the run's split to the others and the path
    # run to the step wall.
    partial = ttft_split(ttfts, spans[:3] + [None])
    assert partial["requests"] == 3 and partial["ttft_s"] == pytest.approx(0.042, abs=1e-9)
    assert serving_path(ttfts, {"steps": 4, "step_time_s": 0.048}, partial)["request_path_s"] == 0.028
    assert ttft_split(ttfts, [None] * 4) is None


def test_a_measurement_with_its_own_path_run_and_time_sets_request_path_s_and_names_both():
    """A measurement made in one sitting (bench/sim_validate.py --measure-profile) carries its own path
    run and its start time: request_path_s comes from that run, not from serve_proxy.json, and the host
    and path sources name the command and the time; the rest is derived as without it."""
    root = Path(__file__).resolve().parents[2]
    committed = json.loads((root / "bench" / "results" / "serving_cost.json").read_text())
    serve = json.loads((root / "bench" / "results" / "serve_proxy.json").read_text())
    profile = json.loads((root / "sim" / "profiles" / "cpu_measured.json").read_text())
    # The committed measurement as serving_cost.py alone makes it: no start time, no path run.
    measured = {
        **{k: v for k, v in committed.items() if k != "measured_at"},
        "command": "python bench/serving_cost.py --models models",
        "serving": {k: v for k, v in committed["serving"].items() if k != "path"},
    }
    path = {
        "requests": 16,
        "engine_steps": 16,
        "ttft_s": 0.061,
        "engine_step_s": 0.0195,
        "request_path_s": 0.0415,
    }
    sitting = {
        **measured,
        "command": "python bench/sim_validate.py --models models --measure-profile",
        "measured_at": "2026-11-30T10:00:00Z",
        "serving": {**measured["serving"], "path": path},
    }
    assert provenance(measured) == measured["command"]
    named = "python bench/sim_validate.py --models models --measure-profile, started 2026-11-30T10:00:00Z"
    assert provenance(sitting) == named
    plain = derive_profile(profile, measured["serving"], serve, provenance(measured))
    fresh = derive_profile(profile, sitting["serving"], serve, provenance(sitting))
    assert fresh["request_path_s"] == 0.0415 != plain["request_path_s"]
    assert {k for k in fresh if fresh[k] != plain[k]} == {"request_path_s", "sources"}
    (path_source,) = [s for s in fresh["sources"] if s.startswith("serving path latency:")]
    assert named in path_source and "serve_proxy" not in path_source
    assert (
        "mean TTFT at the client 61.0 ms less the engines' mean step wall per request 19.5 ms" in path_source
    )
    (host_source,) = [s for s in fresh["sources"] if s.startswith("host block")]
    assert named in host_source
    # A path run with each request's timing names the engine's own part instead of the step wall.
    timed = {**sitting["serving"], "path": {**path, "engine_s": 0.013, "request_path_s": 0.048}}
    own = derive_profile(profile, timed, serve, provenance(sitting))
    assert own["request_path_s"] == 0.048
    (timed_source,) = [s for s in own["sources"] if s.startswith("serving path latency:")]
    assert "less the engine's part per request 13.0 ms (received at the replica" in timed_source
    # Every fitted source names the sitting (the committed measurement has sweeps).
    fitted = [s for s in fresh["sources"] if s.startswith(("SPS(B)", "engine overhead", "drafter cost"))]
    assert len(fitted) == 3 and all(named in s for s in fitted)


def test_the_host_check_sets_each_sweep_runs_measured_stretch_beside_the_host_models():
    """Two engines on 2 cores, each stepping 0.8 of the run, beside a serving path keeping 0.7 cores busy
    (5 processes, each under its equal share). Under the fluid law a step beside the other engine's
    stretches 2 / (2 - 0.7), one alone not at all, mixed 0.8 / 0.2; with 0.2 cores of other work on the
    machine added, 2 / 1.1 and 1. Under the per-core law (the profile's) every step stretches 2 / 1.3
    (2 / 1.1 with the other work). A run recorded without its wall time is left out."""
    host = {"cores": 2, "replicas": 2, "path_processes": 5, "law": "fluid"}
    host |= {"idle_cores": 0.1, "cpu_s_per_token": 0.002, "cpu_s_per_step": 0.004}
    run = {
        "wall_s": 10.0,
        "engine_cpu_s": 8.0,
        "step_time_s": 16.0,
        "stack_cores": 1.5,
        "machine_busy_cores": 1.7,
        "generated_tokens": 480,  # 10 requests of max_tokens 48, 48 tokens and 50 steps a second
        "steps": 500,
    }
    old = {k: v for k, v in run.items() if k != "wall_s"}
    serving = {"engine_sweep": ["engine_c2_p48", "engine_c4_p48"], "max_tokens": 48}
    serving["engine_steps"] = {"engine_c2_p48": run, "engine_c4_p48": old}
    checked = {
        "engine_c2_p48": {
            "measured": 2.0,
            "model": round(0.8 * 2 / 1.3 + 0.2, 3),
            "model_with_other_work": round(0.8 * 2 / 1.1 + 0.2, 3),
            "serving_load_cores": 0.7,
            "serving_load_model_cores": round(0.1 + 48 * 0.002 + 50 * 0.004, 3),  # the host block's, beside
            "other_work_cores": 0.2,
            "engines_stepping": 0.8,
        }
    }
    assert host_check(serving, host) == checked
    per_core = host_check(serving, {**host, "law": "per_core"})["engine_c2_p48"]
    assert (per_core["model"], per_core["model_with_other_work"]) == (round(2 / 1.3, 3), round(2 / 1.1, 3))
    # The mixed law at its own per-core share (the simulator's, HostCost.stretch_at): a step alone pays
    # half the per-core law's stretch beyond the fluid law's; one beside the other engine, as both laws.
    mixed = host_check(serving, {**host, "law": "mixed", "per_core_share": 0.5})["engine_c2_p48"]
    assert mixed["model"] == round(0.8 * 2 / 1.3 + 0.2 * (1 + 0.5 * (2 / 1.3 - 1)), 3)
    # With the run's TTFT in parts and the idle path (20 ms, of which 15 ms CPU): its path beside the
    # model's, at the host model's path stretch (both engines stepping for 0.8^2 of arrivals, 2 / 1.3)
    # and at the run's measured step stretch (2.0).
    host |= {"cpu_s_per_request": 0.012, "replica_cpu_s_per_request": 0.003}
    serving["ttft_split"] = {"engine_c2_p48": {"path_s": 0.031}, "engine_c4_p48": {"path_s": 0.04}}
    assert host_check(serving, host, 0.020) == {
        "engine_c2_p48": {
            **checked["engine_c2_p48"],
            "serving_load_model_cores": round(0.1 + 1 * 0.015 + 48 * 0.002 + 50 * 0.004, 3),
            "path_ms": 31.0,
            "path_model_ms": round((0.005 + 0.015 * (0.64 * 2 / 1.3 + 0.36)) * 1e3, 2),
            "path_at_measured_stretch_ms": 35.0,
            "path_idle_ms": 20.0,
        }
    }
    # With the idle way in (16 ms of the 20: 12 ms of its CPU) and the run's own, the way in likewise.
    serving["ttft_split"]["engine_c2_p48"]["path_in_s"] = 0.024
    way_in = host_check(serving, host, 0.020, 0.016)["engine_c2_p48"]
    assert (way_in["path_in_ms"], way_in["path_in_idle_ms"]) == (24.0, 16.0)
    assert way_in["path_in_model_ms"] == round((0.004 + 0.012 * (0.64 * 2 / 1.3 + 0.36)) * 1e3, 2)


def test_without_open_loop_runs_the_paths_remainder_is_measured_by_the_closed_loops_concurrency():
    """The committed measurement's sweep (its open-loop runs left out): at each concurrency (its requests
    open) each direction's mean measured latency less the host model's (host_check), the two runs at
    concurrency 8 (prompts of 48 and 144 tokens) averaged; at one request open nothing beyond (the path run
    is the idle latency). A measurement whose runs did not time their way in gives no table, and the
    profile none."""
    root = Path(__file__).resolve().parents[2]
    measured = json.loads((root / "bench" / "results" / "serving_cost.json").read_text())
    profile = json.loads((root / "sim" / "profiles" / "cpu_measured.json").read_text())
    serving, host = measured["serving"], profile["host"]
    serving = {k: v for k, v in serving.items() if k != "arrival_runs"}
    measured = {**measured, "serving": serving}
    path, path_in = profile["request_path_s"], profile["request_path_in_s"]
    checked = host_check(serving, host, path, path_in)
    tables = path_beyond(serving, host, path, path_in)
    concurrency = {2: ["engine_c2_p48"], 4: ["engine_c4_p48"], 8: ["engine_c8_p48", "engine_c8_p144"]}
    concurrency[12] = ["engine_c12_p48"]
    assert [n for n, _ in tables["path_in_beyond"]] == [1, 2, 4, 8, 12]
    assert tables["path_in_beyond"][0] == [1, 0.0] and tables["path_back_beyond"][0] == [1, 0.0]
    for (n, way_in), (m, back) in zip(tables["path_in_beyond"][1:], tables["path_back_beyond"][1:]):
        runs = [checked[label] for label in concurrency[n]]
        ins = [r["path_in_ms"] - r["path_in_model_ms"] for r in runs]
        backs = [r["path_ms"] - r["path_in_ms"] - r["path_model_ms"] + r["path_in_model_ms"] for r in runs]
        assert n == m
        assert way_in == pytest.approx(sum(ins) / len(ins) / 1e3, abs=1e-5)
        assert back == pytest.approx(sum(backs) / len(backs) / 1e3, abs=1e-5)
    # The way in grows with the requests open on this machine: 12 open wait longest.
    assert max(tables["path_in_beyond"], key=lambda row: row[1])[0] == 12
    untimed = {
        **serving,
        "ttft_split": {
            k: {kk: vv for kk, vv in v.items() if kk != "path_in_s"} for k, v in serving["ttft_split"].items()
        },
    }
    assert path_beyond(untimed, host, path, path_in) == {}
    serve = json.loads((root / "bench" / "results" / "serve_proxy.json").read_text())
    derived = derive_profile(profile, untimed, serve, provenance(measured))
    assert "path_in_beyond" not in derived["host"]


def test_open_loop_runs_measure_the_paths_remainder_by_the_requests_open_as_each_arrived():
    """An open-loop run's requests by the requests open when each was sent (itself included): 5 alone, and
    5 bursts of three sent 0.1 s apart that end together, then one burst of four (its fourth, the only
    request with 4 open, too few to count). Each count's way in is its requests' mean less the model's at
    the run's load (host_check); the way back (first token less the way in and the engine's queue and
    prefill) by the requests open when the engine made its first token. A request without its replica's
    timing is left out. With such runs the profile takes its table from them."""
    host = {"cores": 2, "replicas": 2, "path_processes": 5, "law": "per_core", "idle_cores": 0.2}
    host |= {"cpu_s_per_request": 0.012, "replica_cpu_s_per_request": 0.003}
    host |= {"cpu_s_per_token": 0.001, "replica_cpu_s_per_token": 0.0001}
    steps = {"wall_s": 60.0, "engine_cpu_s": 40.0, "step_time_s": 60.0, "stack_cores": 1.4}
    steps |= {"machine_busy_cores": 1.4, "generated_tokens": 1000, "steps": 3000}
    inbound = {1: 0.020, 2: 0.030, 3: 0.050, 4: 0.090}
    rows, back = [], 0.006

    def send(at: float, open_now: int, end: float) -> None:
        first = at + inbound[open_now] + 0.002 + 0.010 + back
        rows.append([at, first, end, inbound[open_now], 0.002, 0.010])

    for k in range(5):
        send(10.0 * k, 1, 10.0 * k + 1.0)
    for k in range(5):
        t = 100.0 + 10.0 * k
        for j in range(3):
            send(t + 0.1 * j, j + 1, t + 1.0)
    for j in range(4):
        send(200.0 + 0.1 * j, j + 1, 201.0)
    rows.append([300.0, 300.05, 301.0, None, None, None])  # no timing: left out
    columns = ["sent_s", "first_token_s", "end_s", "inbound_s", "queue_s", "prefill_s"]
    serving = {
        "arrival_runs": {
            "arrivals_r2": {"rate": 2.0, "duration_s": 60.0, "columns": columns, "requests": rows}
        },
        "engine_steps": {"arrivals_r2": steps},
        "ttft_split": {"arrivals_r2": {"path_s": 0.05, "path_in_s": 0.03}},
    }
    checked = host_check(serving, host, 0.020, 0.016)["arrivals_r2"]
    model_in = checked["path_in_model_ms"] / 1e3
    model_back = (checked["path_model_ms"] - checked["path_in_model_ms"]) / 1e3
    tables = path_beyond(serving, host, 0.020, 0.016)
    # Ways in: 11 requests alone (5, and the bursts' firsts), 6 with 2 open, 6 with 3, 1 with 4 (dropped).
    assert tables["path_in_beyond"] == [[n, round(inbound[n] - model_in, 5)] for n in (1, 2, 3)]
    # Ways back: every engine made its first token before the next of its burst was sent.
    assert tables["path_back_beyond"] == [[n, round(back - model_back, 5)] for n in (1, 2, 3)]
    assert open_loop_beyond(serving["arrival_runs"], {}) == []  # no model of the run: nothing


def test_the_paths_cpu_per_token_and_per_step_are_fitted_to_the_runs_loads():
    """Runs whose serving load was made by known costs: 0.2 idle cores, 15 ms per request (its path's 12
    and its replica's 3), 0.9 ms per token (its replica's 0.1 of it) and 2.5 ms per engine step. Sweep
    runs count a request per max_tokens of their tokens, open-loop runs their recorded requests. The fit
    recovers the path's per token (the replicas' left as measured) and per step; a run without its wall
    is left out; with fewer than three runs there is no fit; a fit that wants a negative term drops it."""
    host = {"idle_cores": 0.2, "cpu_s_per_request": 0.012, "replica_cpu_s_per_request": 0.003}
    host |= {"replica_cpu_s_per_token": 0.0001}

    def run(requests: float, tokens: float, steps: float, wall: float = 10.0) -> dict:
        load = 0.2 + (requests * 0.015 + tokens * 0.0009 + steps * 0.0025) / wall
        return {
            "wall_s": wall,
            "generated_tokens": tokens,
            "steps": steps,
            "engine_cpu_s": 9.0,
            "stack_cores": load + 9.0 / wall,
        }

    steps = {
        "engine_c2_p48": run(24, 1152, 1300),
        "engine_c8_p48": run(24, 1152, 800),
        "engine_c12_p48": run(24, 1152, 600, wall=4.0),
        "arrivals_r2": run(30, 900, 900, wall=20.0),
        "engine_c4_p48": {k: v for k, v in run(24, 1152, 1000).items() if k != "wall_s"},
    }
    serving = {"engine_sweep": [k for k in steps if k.startswith("engine")], "max_tokens": 48}
    serving |= {"arrival_runs": {"arrivals_r2": {"requests": [[0.0]] * 30}}, "engine_steps": steps}
    assert set(run_rates(serving)) == {"engine_c2_p48", "engine_c8_p48", "engine_c12_p48", "arrivals_r2"}
    assert run_rates(serving)["arrivals_r2"]["requests_per_s"] == 1.5
    fit = path_load_fit(serving, host)
    assert fit == {
        "cpu_s_per_token": pytest.approx(0.0008, abs=1e-6),
        "cpu_s_per_step": pytest.approx(0.0025),
    }
    serving["engine_sweep"] = ["engine_c2_p48"]
    assert path_load_fit(serving, host) == {}
    # y = 2 x0 - x1 wants a negative per step: the per-token-only fit, through the origin.
    rows, ys = [[1.0, 1.0], [2.0, 1.0], [3.0, 2.0]], [1.0, 3.0, 4.0]
    assert nonnegative_least_squares(rows, ys, "") == pytest.approx((19 / 14, 0.0))
    assert nonnegative_least_squares([[1.0, 2.0], [2.0, 1.0]], [5.0, 4.0], "") == pytest.approx((1.0, 2.0))


def test_with_each_requests_way_in_the_path_splits_into_in_and_back():
    """The four requests above, received at their replicas 20, 22, 18, 20 ms after they were sent: of the
    27 ms path, 20 ms is the way in and 7 ms the first token's way back. One request without its way in
    leaves the run unsplit."""
    ttfts = [0.040, 0.050, 0.036, 0.034]
    spans = [(0.004, 0.010), (0.004, 0.012), (0.004, 0.008), (0.004, 0.006)]
    inbound = [0.020, 0.022, 0.018, 0.020]
    split = ttft_split(ttfts, spans, inbound)
    assert split["path_s"] == 0.027 and split["path_in_s"] == 0.02 and split["path_back_s"] == 0.007
    path = serving_path(ttfts, {"steps": 4, "step_time_s": 0.048}, split)
    assert (path["request_path_s"], path["request_path_in_s"], path["request_path_back_s"]) == (
        0.027,
        0.02,
        0.007,
    )
    unsplit = ttft_split(ttfts, spans, inbound[:3] + [None])
    assert "path_in_s" not in unsplit and unsplit["path_s"] == 0.027
    assert "request_path_in_s" not in serving_path(ttfts, {"steps": 4, "step_time_s": 0.048}, unsplit)


def test_a_path_run_with_its_way_in_writes_request_path_in_s_and_says_so():
    """The profile carries the path's way in when the path run measured it (its source gives both parts),
    and loses an earlier one when a later measurement did not."""
    root = Path(__file__).resolve().parents[2]
    committed = json.loads((root / "bench" / "results" / "serving_cost.json").read_text())
    serve = json.loads((root / "bench" / "results" / "serve_proxy.json").read_text())
    profile = json.loads((root / "sim" / "profiles" / "cpu_measured.json").read_text())
    path = {
        "requests": 16,
        "engine_steps": 16,
        "ttft_s": 0.061,
        "engine_step_s": 0.0195,
        "engine_s": 0.02,
        "request_path_s": 0.041,
        "request_path_in_s": 0.03,
        "request_path_back_s": 0.011,
    }
    serving = {**committed["serving"], "path": path}
    fresh = derive_profile(profile, serving, serve, "cmd")
    assert (fresh["request_path_s"], fresh["request_path_in_s"]) == (0.041, 0.03)
    assert from_dict(fresh).request_path_in_s == 0.03
    (source,) = [s for s in fresh["sources"] if s.startswith("serving path latency:")]
    assert (
        "request_path_in_s 30.0 ms is the way in" in source
        and "11.0 ms, the first token's way back" in source
    )
    unsplit = {k: v for k, v in path.items() if k not in ("request_path_in_s", "request_path_back_s")}
    again = derive_profile(fresh, {**serving, "path": unsplit}, serve, "cmd")
    assert "request_path_in_s" not in again and from_dict(again).request_path_in_s is None


def test_the_engines_forward_timers_are_set_beside_the_fitted_forward():
    """A run of 100 one-token steps whose engine was on a CPU half its steps' wall and timed 1.2 s of
    forward: 6 ms of forward CPU a step, against the fitted 1.2 x 1/200 s. A run without the timer is
    left out."""
    from bench.cost_profile import forward_over_model

    run = {"steps": 100, "forward_tokens": 100, "rounds": 100, "engine_cpu_s": 1.0, "step_time_s": 2.0}
    serving = {"engine_steps": {"a": {**run, "forward_time_s": 1.2}, "b": run}}
    assert forward_over_model(serving, ["a", "b"], lambda b: 200.0, 1.2) == pytest.approx([1.0])
    assert forward_over_model(serving, ["a"], lambda b: 200.0, 0.6) == pytest.approx([2.0])


def test_a_sweep_with_the_engines_forward_timers_reshapes_the_table_to_them():
    """The committed measurement's sweep carries the engines' forward timers: the derived profile's table
    is the start-up one reshaped to them (its source lists the ratios; marked as the served forward's,
    which a validation keeps in place of the start-up table), and over it the timers read the fitted
    forward closer to 1 at every run than over the start-up table. A profile without the mark takes the
    replicas' table as before."""
    from bench.cost_profile import forward_over_model

    root = Path(__file__).resolve().parents[2]
    measured = json.loads((root / "bench" / "results" / "serving_cost.json").read_text())
    serve = json.loads((root / "bench" / "results" / "serve_proxy.json").read_text())
    profile = json.loads((root / "sim" / "profiles" / "cpu_measured.json").read_text())
    serving = measured["serving"]
    startup = serving["sps_table"]
    fitted = derive_profile(profile, serving, serve, provenance(measured))
    assert fitted["sps_served"] is True and fitted["sps"]["points"] == startup["points"]
    assert fitted["sps"]["rates"] != startup["rates"]
    (sps_source,) = [s for s in fitted["sources"] if s.startswith("SPS(B)")]
    assert "reshaped to the served forward" in sps_source
    sweep = serving["engine_sweep"]
    over_startup = from_dict({**fitted, "sps": {k: startup[k] for k in ("points", "rates")}})
    before = forward_over_model(serving, sweep, over_startup.cost_table(), fitted["forward_scale"])
    after = forward_over_model(serving, sweep, from_dict(fitted).cost_table(), fitted["forward_scale"])
    assert max(abs(r - 1) for r in after) < max(abs(r - 1) for r in before)
    served = from_dict(fitted)
    assert served.over_table([1, 1024], [1.0, 1.0]) is served
    unmarked = from_dict({k: v for k, v in fitted.items() if k != "sps_served"})
    assert unmarked.over_table([1, 1024], [1.0, 1.0]).sps_rates == (1.0, 1.0)
