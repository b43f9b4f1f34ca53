"""The serving path's latency beyond the CPU-stretch model, by the requests open on it (sim/host.py beyond,
HostCost.path_in_beyond / path_back_beyond; sim/cluster.py counts the requests open on the path)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from sim.cluster import Cluster, ClusterConfig, Failure, Group
from sim.host import HostCost, beyond, jitter
from sim.profiles import load
from sim.workload import Request
from tests.sim.test_simulator import CLASSES, simulate, small_profile

TABLE = ((1, 0.0), (2, 0.010), (4, 0.030))


def test_beyond_interpolates_between_the_measured_counts_and_holds_at_the_ends():
    assert beyond((), 7) == 0.0
    assert [beyond(TABLE, n) for n in (0, 1, 2, 4)] == [0.0, 0.0, 0.010, 0.030]
    assert beyond(TABLE, 3) == pytest.approx(0.020, rel=1e-12)
    assert beyond(TABLE, 40) == 0.030  # nothing extrapolated past the largest count measured
    assert beyond(((2, -0.002), (4, 0.001)), 1) == -0.002  # a negative remainder is a measurement too


def test_a_host_block_reads_its_tables_as_tuples_and_a_profile_without_them_has_none():
    cost = HostCost.from_json({"cores": 2, "replicas": 2, "path_in_beyond": [[1, 0], [4, 0.03]]})
    assert cost.path_in_beyond == ((1, 0.0), (4, 0.03)) and cost.path_back_beyond == ()
    hash(cost)  # hosts compare and hash their cost blocks (sim/cluster.py places replicas by them)
    assert load("gpu_dsv4flash_rocm").host is None


def burst(cost: HostCost, n: int = 4) -> list[Request]:
    """`n` requests arriving at once on two plain replicas of a host whose path is 20 ms idle (15 ms in,
    5 ms back) with no CPU in it (it does not stretch): any difference in their ways is the table's."""
    requests = [
        Request(rid=i, arrival=0.0, prompt_tokens=32, max_tokens=8, sla_class="standard", domain="easy")
        for i in range(n)
    ]
    profile = small_profile(host=cost, request_path_s=0.020, request_path_in_s=0.015)
    config = ClusterConfig(
        fleet=[Group(profile, 2, "plain", drafting=False)],
        classes=CLASSES,
        default_class="standard",
        router="pow2",
    )
    cluster = Cluster(config, requests)
    cluster.run(100.0)
    assert all(r.outcome == "done" for r in requests) and cluster.open_on_path == 0
    return requests


def test_each_arrival_of_a_burst_waits_as_measured_at_the_requests_then_open():
    """Four at once: the k-th finds k open (itself included), so its way in is 15 ms and the table at k;
    their first tokens come out with all four open, so each way back is 5 ms and the table at 4."""
    cost = HostCost(cores=2, replicas=2, path_in_beyond=TABLE, path_back_beyond=((1, 0.0), (4, 0.006)))
    requests = burst(cost)
    ways_in = [r.admitted - r.arrival for r in requests]
    assert ways_in == pytest.approx([0.015, 0.025, 0.035, 0.045], abs=1e-12)
    assert [r.path_back for r in requests] == pytest.approx([0.011] * 4, abs=1e-12)
    plain = burst(dataclasses.replace(cost, path_in_beyond=(), path_back_beyond=()))
    assert [r.admitted - r.arrival for r in plain] == pytest.approx([0.015] * 4, abs=1e-12)
    assert [r.path_back for r in plain] == pytest.approx([0.005] * 4, abs=1e-12)
    # A path that does not stretch is its idle latency: the tables do not apply either (the validation's
    # "path at idle" variant, bench/sim_validate.py).
    idle = burst(dataclasses.replace(cost, path_stretches=False))
    assert [r.admitted - r.arrival for r in idle] == pytest.approx([0.015] * 4, abs=1e-12)
    assert [r.path_back for r in idle] == pytest.approx([0.005] * 4, abs=1e-12)


def test_the_requests_open_on_the_path_come_back_to_those_still_pending_after_failures():
    """Every way a request ends takes it off the path (done, shed, refused, failed with its replica)."""
    cost = HostCost(
        cores=2,
        replicas=3,
        idle_cores=0.2,
        cpu_s_per_request=0.01,
        path_in_beyond=TABLE,
        path_back_beyond=TABLE,
    )
    profile = small_profile(host=cost, request_path_s=0.02, request_path_in_s=0.015)
    cluster, requests = simulate(
        "sla", seed=5, rate=40.0, profile=profile, failures=[Failure(3.0, 0, 2.0), Failure(5.0, 1, 2.0)]
    )
    outcomes = {r.outcome for r in requests}
    assert "failed" in outcomes and "done" in outcomes
    assert cluster.open_on_path == sum(r.outcome == "pending" for r in requests)


def test_the_committed_cpu_profile_carries_the_tables_its_measurement_gives():
    """cpu_measured.json was derived from bench/results/serving_cost.json (bench/cost_profile.py
    path_beyond): its tables are the ones that measurement gives, ascending in the requests open."""
    from bench.cost_profile import path_beyond

    root = Path(__file__).resolve().parents[2]
    serving = json.loads((root / "bench" / "results" / "serving_cost.json").read_text())["serving"]
    profile = json.loads((root / "sim" / "profiles" / "cpu_measured.json").read_text())
    tables = path_beyond(serving, profile["host"], profile["request_path_s"], profile["request_path_in_s"])
    for key in ("path_in_beyond", "path_back_beyond"):
        assert profile["host"][key] == tables[key]
        counts = [n for n, _ in profile["host"][key]]
        assert counts == sorted(set(counts))
    host = load("cpu_measured").host
    assert host.path_in_beyond == tuple((n, s) for n, s in tables["path_in_beyond"])
    # The requests' spread around those tables, from the same open-loop runs: 21 quantiles, ascending.
    for key in ("path_in_jitter", "path_back_jitter"):
        assert profile["host"][key] == tables[key] and len(tables[key]) == 21
        assert tables[key] == sorted(tables[key]) and tables[key][0] < 0 < tables[key][-1]


def test_the_spread_is_each_requests_deviation_from_the_tables_mean_at_its_count():
    from bench.cost_profile import spread_quantiles

    by_open = {1: [0.001, 0.003], 3: [0.010, 0.020]}
    quantiles = spread_quantiles(by_open, {1: 0.002, 3: 0.015})  # deviations -1, +1, -5, +5 ms
    assert len(quantiles) == 21 and quantiles[0] == -0.005 and quantiles[-1] == 0.005
    assert quantiles[10] == pytest.approx(0.0, abs=1e-12)
    # A count the table lacks reads it as the simulator does (interpolated between its counts).
    assert spread_quantiles({2: [0.010]}, {1: 0.0, 3: 0.010}) == [0.005] * 21
    assert spread_quantiles({}, {1: 0.0}) == []


def test_a_spread_is_drawn_from_its_quantiles_linearly_between_them():
    quantiles = (-0.004, 0.0, 0.002, 0.010)
    assert jitter((), 0.3) == 0.0 and jitter((0.005,), 0.9) == 0.005
    assert jitter(quantiles, 0.0) == -0.004
    assert jitter(quantiles, 0.5) == pytest.approx(0.001, abs=1e-12)  # half way from 0 to 2 ms
    assert jitter(quantiles, 0.999999) == pytest.approx(0.010, abs=1e-7)
    cost = HostCost.from_json({"cores": 2, "replicas": 2, "path_in_jitter": [-0.001, 0.002]})
    assert cost.path_in_jitter == (-0.001, 0.002) and cost.path_back_jitter == ()


def test_each_request_draws_its_own_deviation_from_the_measured_spread_the_same_under_a_seed():
    """With a spread measured around the table, the ways in and back of a burst vary request to request
    within it (never below 0), the same on a rerun; without one, every request takes the table's value."""
    spread = (-0.004, -0.001, 0.0, 0.003, 0.012)
    cost = HostCost(
        cores=2,
        replicas=2,
        path_in_beyond=TABLE,
        path_back_beyond=((1, 0.0), (4, 0.006)),
        path_in_jitter=spread,
        path_back_jitter=spread,
    )
    requests = burst(cost, 8)
    plain = burst(dataclasses.replace(cost, path_in_jitter=(), path_back_jitter=()), 8)
    deviations = [
        (r.admitted - r.arrival) - (p.admitted - p.arrival) for r, p in zip(requests, plain, strict=True)
    ]
    backs = [r.path_back - p.path_back for r, p in zip(requests, plain, strict=True)]
    for drawn in (deviations, backs):
        assert all(spread[0] - 1e-12 <= d <= spread[-1] + 1e-12 for d in drawn)
        assert len({round(d, 9) for d in drawn}) > 4  # each request its own draw
    again = burst(cost, 8)
    assert [r.admitted for r in again] == [r.admitted for r in requests]
    assert [r.path_back for r in again] == [r.path_back for r in requests]
