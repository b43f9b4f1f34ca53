"""The serving path's latency beyond the CPU-stretch model, by the requests open on it (sim/host.py beyond,
HostCost.path_in_beyond / path_back_beyond; sim/cluster.py counts the requests open on the path)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from sim.cluster import Cluster, ClusterConfig, Failure, Group
from sim.host import HostCost, beyond
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
