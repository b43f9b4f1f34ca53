"""bench/sim_arrivals.py: serving_cost's open-loop runs as a simulator trace, and both sides in one view."""

from __future__ import annotations

import numpy as np
import pytest

from bench.sim_arrivals import markdown, quantiles, real_side, sim_side, steps_view, trace_of
from sim.workload import Request

COLUMNS = ["sent_s", "first_token_s", "end_s", "inbound_s", "queue_s", "prefill_s"]


def test_a_run_becomes_its_requests_at_their_send_times_with_the_prompts_in_turn():
    rows = [
        [0.5, 0.6, 1.5, 0.02, 0.01, 0.03],
        [0.2, 0.3, 1.0, None, None, None],
        [0.9, 1.0, 2.0, 0.02, 0.0, 0.02],
    ]
    prompts = [(1, 2, 3), (4, 5)]
    trace, records = trace_of({"columns": COLUMNS, "requests": rows}, prompts, ["code", "prose"], 10)
    assert [r.rid for r in trace] == [1, 0, 2]  # by send time; the i-th sent the i-th prompt in turn
    assert [r.prompt_ids for r in trace] == [(4, 5), (1, 2, 3), (1, 2, 3)]
    assert [r.domain for r in trace] == ["prose", "code", "code"]
    assert all(r.max_tokens == 10 and r.prompt_tokens == len(r.prompt_ids) for r in trace)
    real = real_side(records, 11)
    assert real["ttft"]["p50_ms"] == pytest.approx(100.0)
    assert real["tpot"]["p50_ms"] == pytest.approx(90.0)  # (1.5 - 0.6) / 10
    assert real["queue"] == quantiles([0.01, 0.0])  # requests without their replica's timing left out


def test_the_simulated_side_reads_its_requests_parts_and_counts_the_unfinished():
    done = Request(0, 1.0, 8, 5, "standard", "code", first_token=1.2, finish=1.6, generated=5, outcome="done")
    done.admitted, done.scheduled, done.path_back = 1.05, 1.1, 0.02
    pending = Request(1, 2.0, 8, 5, "standard", "code")
    side = sim_side([done, pending])
    assert side["unfinished"] == 1
    assert side["ttft"]["p50_ms"] == pytest.approx(200.0) and side["tpot"]["p50_ms"] == pytest.approx(100.0)
    assert side["inbound"]["p50_ms"] == pytest.approx(50.0)
    assert side["queue"]["p50_ms"] == pytest.approx(50.0) and side["prefill"]["p50_ms"] == pytest.approx(80.0)


def test_both_sides_render_as_one_table_row_each():
    side = {k: quantiles([0.01, 0.02]) for k in ("ttft", "tpot", "inbound", "queue", "prefill")}
    engines = steps_view(100, 2.0, 1.0, 150, 120, 7, 3)
    assert engines == {
        "steps": 100,
        "mean_step_ms": 20.0,
        "tokens_per_step": 1.5,
        "requests_per_step": 1.2,
        "stretch": 2.0,
        "drafted_tokens": 7,
        "accepted_tokens": 3,
    }
    run = {"real": {**side, "engines": engines}, "sim": {**side, "engines": engines}}
    text = markdown({"measurement": "m", "command": "c", "runs": {"arrivals_r2": run}})
    assert text.count("| arrivals_r2 |") == 2 and "| 100 | 20.0 | 1.5 | 2.0 | 7 |" in text


def test_pairing_sets_each_requests_real_tpot_beside_its_simulated_one_and_the_company_it_kept():
    """Two requests decoding alone, real TPOT as simulated; two decoding together, real at twice the
    simulated: the ratio's p50 between, its correlation with the requests decoding beside each is 1 (and
    no correlation where one side does not vary)."""
    from bench.sim_arrivals import paired

    rows, requests = [], []
    for i, (first, end, factor) in enumerate(
        [(0.0, 1.0, 1.0), (5.0, 6.0, 1.0), (10.0, 12.0, 2.0), (10.0, 12.0, 2.0)]
    ):
        rows.append({"sent_s": first - 0.1, "first_token_s": first, "end_s": end})
        sim_tpot = (end - first) / 10 / factor
        requests.append(
            Request(
                i,
                first - 0.1,
                8,
                11,
                "standard",
                "code",
                first_token=first,
                finish=first + 10 * sim_tpot,
                generated=11,
                outcome="done",
            )
        )
    requests.append(Request(4, 20.0, 8, 11, "standard", "code"))  # unfinished in the simulator: left out
    rows.append({"sent_s": 20.0, "first_token_s": 20.1, "end_s": 21.0})
    p = paired(rows, requests, 11)
    assert p["tpot_real_over_sim"][1] == pytest.approx(1.5)
    assert p["ratio_vs_decoding_beside_real"] == pytest.approx(1.0)
    assert p["ratio_vs_decoding_beside_sim"] == pytest.approx(1.0)  # the same spans on both sides here
    assert p["tpot_correlation"] is None  # every simulated TPOT is 0.1 s
    # Each side's TPOT by its own concurrency: two requests alone (1), two together (2).
    real = {r["from"]: (r["requests"], r["tpot_ms"]) for r in p["by_concurrency"]["real"]}
    sim = {r["from"]: (r["requests"], r["tpot_ms"]) for r in p["by_concurrency"]["sim"]}
    assert real[1.0] == (2, 100.0) and real[2.0] == (2, 200.0) and real[0.0] == (0, None)
    assert sim[1.0] == (2, 100.0) and sim[2.0] == (2, 100.0)
    assert "on_own_replica" not in p  # the rows name no replica

    # Named: the two together ran on one replica for real and on two in the simulator.
    for row, replica in zip(rows, (0, 1, 0, 0, 1)):
        row["replica"] = replica
    for req, replica in zip(requests, ("r0", "r1", "r0", "r1")):
        req.replica = replica
    own = paired(rows, requests, 11)["on_own_replica"]
    assert (own["real"]["mean_beside"], own["real"]["share_on_own"]) == (1.5, 1.0)
    assert (own["sim"]["mean_beside"], own["sim"]["share_on_own"]) == (1.0, 0.75)
    real = {r["from"]: (r["requests"], r["tpot_ms"]) for r in own["real"]["by_concurrency"]}
    assert real[1.0] == (2, 100.0) and real[2.0] == (2, 200.0)
    assert {r["from"]: r["requests"] for r in own["sim"]["by_concurrency"]}[1.0] == 4
    # Alone on its replica: both sides' first two, beside nobody; the simulator's last two, beside each other.
    alone = {
        side: {r["from"]: (r["requests"], r["tpot_ms"]) for r in own[side]["alone_by_others"]} for side in own
    }
    assert alone["real"][0.0] == (2, 100.0) and sum(n for n, _ in alone["real"].values()) == 2
    assert alone["sim"][0.0] == (2, 100.0) and alone["sim"][0.75] == (2, 100.0)
    side = {k: quantiles([0.01, 0.02]) for k in ("ttft", "tpot", "inbound", "queue", "prefill")}
    side["engines"] = steps_view(100, 2.0, 1.0, 150, 120, 7, 3)
    run = {"real": side, "sim": side, "paired": {**p, "on_own_replica": own}}
    text = markdown({"measurement": "m", "command": "c", "runs": {"arrivals_r2": run}})
    assert "on its replica, mean: real 1.5, sim 1.0; their share of those on both: real 1.0, sim 0.75" in text
    assert "| real | - | 100.0 (2) | - | 200.0 (2) | - | - | - |" in text
    assert "| sim | 100.0 (2) | - | 100.0 (2) | - |" in text  # the alone ones, by the others beside


def test_tpot_by_concurrency_bins_every_request_once():
    from bench.sim_arrivals import by_concurrency

    rows = by_concurrency(np.array([10.0, 12.0, 20.0, 30.0]), np.array([0.5, 1.0, 3.5, 9.0]))
    assert sum(r["requests"] for r in rows) == 4
    assert [(r["from"], r["requests"], r["tpot_ms"]) for r in rows if r["requests"]] == [
        (0.0, 1, 10.0),
        (1.0, 1, 12.0),
        (3.0, 1, 20.0),
        (8.0, 1, 30.0),
    ]
    assert rows[-1]["below"] == float("inf")


def test_pairing_reads_each_rows_own_token_count_and_leaves_out_the_rows_without_an_end():
    """The validation's trace draws each request's length: its rows keep what each generated."""
    from bench.sim_arrivals import paired

    rows, requests = [], []
    for i, generated in enumerate((11, 21, 6, 2)):
        rows.append({"sent_s": i - 0.1, "first_token_s": float(i), "end_s": i + 0.01 * (generated - 1)})
        rows[-1]["generated"] = generated
        requests.append(
            Request(
                i,
                i - 0.1,
                8,
                generated,
                "standard",
                "code",
                first_token=float(i),
                finish=i + 0.005 * (generated - 1),
                generated=generated,
                outcome="done",
            )
        )
    rows[3]["end_s"] = None  # its stream never ended for real: left out
    p = paired(rows, requests, None)
    assert p["tpot_real_over_sim"] == [2.0, 2.0, 2.0]  # 10 ms a token real, 5 simulated, whatever the length
    assert sum(r["requests"] for r in p["by_concurrency"]["real"]) == 3


def test_the_load_response_sets_each_windows_mean_tpot_side_by_side_and_the_real_ones_slope_on_the_sim():
    from bench.sim_arrivals import load_response

    sent = np.repeat(np.arange(4) * 10.0 + 1.0, 6)  # six requests in each of four 10 s windows
    sim = np.repeat(np.array([0.004, 0.005, 0.006, 0.005]), 6)
    real = 2 * sim - 0.004  # the real TPOT swings twice as far with the load
    out = load_response(sent, real, sim)
    assert out["from_s"] == [0.0, 10.0, 20.0, 30.0]
    assert out["sim_ms"] == [4.0, 5.0, 6.0, 5.0] and out["real_ms"] == [4.0, 6.0, 8.0, 6.0]
    assert out["slope_real_on_sim"] == pytest.approx(2.0) and out["correlation"] == pytest.approx(1.0)
    assert load_response(sent[:12], real[:12], sim[:12]) == {}  # two windows say nothing of a slope
    few = load_response(np.append(sent, 45.0), np.append(real, 0.1), np.append(sim, 0.1))
    assert few["from_s"] == [0.0, 10.0, 20.0, 30.0]  # a window of one request is left out
