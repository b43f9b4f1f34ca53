"""The serving path split into its way in (arrival to the replica) and the first token's way back
(sim/host.py path_parts, sim/cluster.py): the router sees a request at the end of the way in, the way back
delays the first token and every later one alike (TPOT keeps), and a profile without the split keeps the
whole path before the router."""

from __future__ import annotations

import dataclasses
import json

import pytest

from sim.host import HostCost, path_latency, path_parts
from sim.profiles import PROFILE_DIR, from_dict, load
from tests.sim.test_simulator import simulate, small_profile


def test_each_part_takes_its_latencys_share_of_the_paths_cpu():
    (inbound, back) = path_parts(0.020, 0.015, 0.010)
    assert inbound == pytest.approx((0.015, 0.0075), rel=1e-12)
    assert back == pytest.approx((0.005, 0.0025), rel=1e-12)
    # At any one stretch the parts add up to the whole path (path_latency is linear in its latency).
    for s in (1.0, 1.4, 2.5):
        whole = path_latency(0.020, 0.010, s)
        assert path_latency(*inbound, s) + path_latency(*back, s) == pytest.approx(whole, rel=1e-12)
    # A way in measured beyond the path (noise) is cut to it; a negative one to 0.
    assert path_parts(0.020, 0.030, 0.010) == ((0.020, 0.010), (0.0, 0.0))
    assert path_parts(0.020, -0.001, 0.010) == ((0.0, 0.0), (0.020, 0.010))
    assert path_parts(0.0, 0.0, 0.010) == ((0.0, 0.0), (0.0, 0.0))


def test_a_profile_reads_its_way_in_and_one_without_it_has_none():
    data = json.loads((PROFILE_DIR / "cpu_measured.json").read_text())
    # The committed profile carries the way in its measurement had (none before the split was measured).
    assert load("cpu_measured").request_path_in_s == data.get("request_path_in_s")
    unsplit = {k: v for k, v in data.items() if k != "request_path_in_s"}
    assert from_dict(unsplit).request_path_in_s is None
    assert from_dict({**unsplit, "request_path_in_s": 0.0155}).request_path_in_s == 0.0155


def fingerprints(profile) -> list[tuple]:
    _, requests = simulate("sla", seed=5, profile=profile)
    return [(r.outcome, r.replica, r.ttft, r.tpot, r.admitted, r.scheduled) for r in requests]


@pytest.mark.parametrize(
    "host",
    [None, HostCost(cores=2, replicas=3, idle_cores=0.2, cpu_s_per_request=0.03, cpu_s_per_token=0.001)],
    ids=["own CPUs", "busy host"],
)
def test_the_way_back_delays_the_first_token_and_leaves_everything_else_as_it_was(host):
    """The same trace with a 15 ms path all before the router, and with that 15 ms as the way in of a
    20 ms path: the engines see every request at the same time (the path's CPU, 30 ms a request, is
    all of either path, so the way in stretches alike), so routing, queueing and TPOT are identical and
    each TTFT is longer by exactly its way back: 5 ms on its own CPUs, at least that on a busy host."""
    before = small_profile(host=host, request_path_s=0.015)
    split = dataclasses.replace(before, request_path_s=0.020, request_path_in_s=0.015)
    _, old = simulate("sla", seed=5, profile=before)
    _, new = simulate("sla", seed=5, profile=split)
    done = [(a, b) for a, b in zip(old, new) if a.outcome == "done"]
    assert len(done) > 50 and all(b.outcome == "done" for _, b in done)
    for a, b in zip(old, new):
        assert (a.outcome, a.replica, a.admitted, a.scheduled) == (
            b.outcome,
            b.replica,
            b.admitted,
            b.scheduled,
        )
    assert all(b.tpot == pytest.approx(a.tpot, abs=1e-12) for a, b in done)
    backs = [b.ttft - a.ttft for a, b in done]
    assert all(back == pytest.approx(b.path_back, abs=1e-12) for back, (_, b) in zip(backs, done))
    assert all(a.path_back == 0.0 for a, _ in done)
    if host is None:
        assert all(back == pytest.approx(0.005, abs=1e-12) for back in backs)
    else:  # stretched at the contention when the engine produced the token: sometimes longer
        assert min(backs) >= 0.005 - 1e-12 and max(backs) > 0.005 * 1.2
    # TTFT in parts still adds up, the way back in the path and not in the prefill.
    for a, b in done:
        path, queue, prefill = b.ttft_parts
        assert path + queue + prefill == pytest.approx(b.ttft, abs=1e-9)
        assert path == pytest.approx(a.ttft_parts[0] + b.path_back, abs=1e-12)
        assert prefill == pytest.approx(a.ttft_parts[2], abs=1e-12)


def test_an_unsplit_profile_runs_as_before_with_the_whole_path_before_the_router():
    """request_path_in_s None: the router sees the request after the whole path (its every figure as with
    the way in equal to the whole path, and no way back)."""
    cost = HostCost(cores=2, replicas=3, idle_cores=0.2, cpu_s_per_request=0.01, cpu_s_per_token=0.001)
    whole = small_profile(host=cost, request_path_s=0.015)
    assert fingerprints(whole) == fingerprints(dataclasses.replace(whole, request_path_in_s=0.015))
