"""The host model (sim/host.py): the serving path's load (the replica's own serving threads included) and
the other engines stretch the steps when the host's cores are short, and nothing changes when they are
not."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from sim.cluster import Cluster, ClusterConfig, Failure, Group
from sim.host import Host, HostCost, path_latency, stretch
from sim.profiles import load
from sim.workload import Request
from tests.sim.test_simulator import CLASSES, simulate, small_profile


def one_request(host: HostCost | None, output: int = 40) -> Request:
    """One request alone on one plain-decoding replica (one token per step: no randomness)."""
    req = Request(
        rid=0, arrival=0.0, prompt_tokens=32, max_tokens=output, sla_class="standard", domain="easy"
    )
    config = ClusterConfig(
        fleet=[Group(small_profile(host=host), 1, "plain", drafting=False)],
        classes=CLASSES,
        default_class="standard",
        router="pow2",
    )
    Cluster(config, [req]).run(100.0)
    assert req.outcome == "done" and req.generated == output
    return req


def tpot(req: Request) -> float:
    return (req.finish - req.first_token) / (req.generated - 1)


def test_the_replicas_serving_threads_compete_for_a_core_and_do_not_delay_the_engine():
    """Measured (serving_cost.json's engine_blocked_s about 0): they never hold the engine up, they are the
    host's load like the rest of the serving path (under the fluid law, with a core to spare, they then
    cost the engine nothing)."""
    alone = one_request(None)
    costly = HostCost(cores=8, replicas=1, replica_cpu_s_per_request=0.004, replica_cpu_s_per_token=0.003)
    roomy = one_request(dataclasses.replace(costly, law="fluid"))  # the fluid law: a free core takes them
    assert (roomy.first_token, roomy.finish) == (alone.first_token, alone.finish)
    host = Host(dataclasses.replace(costly, cpu_s_per_request=0.01, cpu_s_per_token=0.001))
    host.serve(1.0, requests=2, tokens=10)  # 2 x (0.01 + 0.004) + 10 x (0.001 + 0.003) CPU seconds
    assert host.load(1.0) == pytest.approx(0.028 + 0.04, rel=1e-12)


def test_the_paths_load_stretches_a_lone_engine_by_its_cores_share_and_under_the_fluid_law_not_at_all():
    """One engine on a 2-core host beside an idle stack keeping one core busy. Per core (measured:
    bench/host_sharing.py) its core carries half that load, so every step takes 2 / (2 - 1) as long;
    under the fluid law the free core takes it all and nothing changes."""
    alone = one_request(None)
    cost = HostCost(cores=2, replicas=1, idle_cores=1.0, cpu_s_per_token=0.0)
    shared = one_request(cost)
    assert shared.first_token == pytest.approx(2 * alone.first_token, rel=1e-12)
    assert tpot(shared) == pytest.approx(2 * tpot(alone), rel=1e-12)
    roomy = one_request(dataclasses.replace(cost, law="fluid"))
    assert (roomy.first_token, roomy.finish) == (alone.first_token, alone.finish)


def test_the_serving_paths_load_stretches_steps_by_demand_over_cores():
    alone = one_request(None)
    # One core, one engine stepping, an idle stack keeping one core busy: every step takes twice as long.
    shared = one_request(HostCost(cores=1, replicas=1, idle_cores=1.0))
    assert shared.first_token == pytest.approx(2 * alone.first_token, rel=1e-12)
    assert tpot(shared) == pytest.approx(2 * tpot(alone), rel=1e-12)


def test_steps_share_the_cores_as_processes_do_a_step_started_alone_slows_when_another_starts():
    """Processor sharing: each change of the steps in flight re-times every one of them at the new mix."""
    host = Host(HostCost(cores=1, replicas=2))  # one engine stepping runs as alone, two at half speed
    assert host.start(0.0, "a", 1.0) == {"a": 1.0}
    # Half of a's work is done when b starts: both then run at half speed.
    assert host.start(0.5, "b", 1.0) == pytest.approx({"a": 1.5, "b": 2.5}, rel=1e-12)
    assert host.stepping == 2
    # When a ends, b has done half its work at half speed: the rest runs alone.
    assert host.finish(1.5, "a") == pytest.approx({"b": 2.0}, rel=1e-12)
    assert host.finish(2.0, "b") == {} and host.stepping == 0
    assert host.finish(2.0, "b") == {} and host.stepping == 0  # a step ended twice counts once


def test_in_the_cluster_a_step_that_started_alone_ends_later_when_another_engine_steps_beside_it():
    """Two requests on the two replicas of a one-core host, the second arriving while the first's prefill
    runs: the first's TTFT is longer than alone, by less than twice (it ran alone for its first 0.1 ms),
    and the second's about the same (both ran at half speed while both stepped)."""
    profile = small_profile(host=HostCost(cores=1, replicas=2))
    reqs = [
        Request(rid=i, arrival=i * 1e-4, prompt_tokens=512, max_tokens=2, sla_class="standard", domain="easy")
        for i in range(2)
    ]
    alone = Request(rid=0, arrival=0.0, prompt_tokens=512, max_tokens=2, sla_class="standard", domain="easy")
    for requests in ([alone], reqs):
        config = ClusterConfig(
            fleet=[Group(profile, 2, "plain", drafting=False)],
            classes=CLASSES,
            default_class="standard",
            router="round_robin",
        )
        Cluster(config, requests).run(100.0)
    ttft_alone = alone.first_token - alone.arrival
    first = reqs[0].first_token - reqs[0].arrival
    assert ttft_alone < first < 2 * ttft_alone
    assert reqs[1].first_token - reqs[1].arrival == pytest.approx(first, rel=1e-2)


def test_a_replica_counts_its_steps_time_alone_and_its_forward_tokens_beside_the_engines_counters():
    """The model's view of the steps, set beside a real run's engine counters by bench/sim_validate.py:
    on a host where every step runs twice as long, the time alone is half the step time; the forward
    carries every prompt token and each decoding round's token and drafts."""

    def replica(host: HostCost | None):
        req = Request(
            rid=0, arrival=0.0, prompt_tokens=32, max_tokens=40, sla_class="standard", domain="easy"
        )
        config = ClusterConfig(
            fleet=[Group(small_profile(host=host), 1)], classes=CLASSES, default_class="standard"
        )
        cluster = Cluster(config, [req])
        cluster.run(100.0)
        (only,) = cluster.all_replicas()
        return only.counters

    alone = replica(None)
    assert alone.alone_time_s == pytest.approx(alone.step_time_s, rel=1e-12)
    assert alone.forward_tokens == 32 + alone.rounds + alone.drafted_tokens
    shared = replica(HostCost(cores=1, replicas=1, idle_cores=1.0))
    assert shared.alone_time_s == pytest.approx(shared.step_time_s / 2, rel=1e-12)
    assert shared.forward_tokens == 32 + shared.rounds + shared.drafted_tokens


def test_serving_load_is_its_cpu_at_the_recent_rate_and_decays():
    host = Host(
        HostCost(
            cores=2,
            replicas=2,
            idle_cores=0.1,
            cpu_s_per_request=0.01,
            cpu_s_per_token=0.002,
            path_processes=2,
        )
    )
    host.serve(1.0, requests=2, tokens=40)  # 0.02 + 0.08 CPU seconds
    assert host.load(1.0) == pytest.approx(0.1 + 0.1)
    assert host.load(2.0) == pytest.approx(0.1 + 0.1 / math.e)
    host.start(1.0, "a", 1.0)
    host.start(1.0, "b", 1.0)  # the serving path gets its 0.2 cores, the two engines share the 1.8 left
    assert host.stretch(1.0) == pytest.approx(2 / 1.8)
    host.finish(1.0, "b")  # demand 1.2 of 2 cores: its core carries half the path's 0.2 (fluid: no stretch)
    assert host.stretch(1.0) == pytest.approx(2 / 1.8) and stretch(0.2, 2, 1, 2, "fluid") == 1.0
    host.serve(1.0, tokens=1000)  # its 2 processes now want 1.1 cores each: all 3 runnable get an equal share
    assert host.stretch(1.0) == pytest.approx(3 / 2)


def test_the_mixed_law_lies_its_share_of_the_way_from_the_fluid_law_to_the_per_core_one():
    # 2 cores, the path at 0.5: alone, fluid 1.0 and per core 2 / 1.5; both stepping, both 2 / 1.5.
    fluid, per_core = 1.0, 2 / 1.5
    assert stretch(0.5, 2, 1, 5, "mixed", 0.25) == pytest.approx(fluid + 0.25 * (per_core - fluid), rel=1e-12)
    assert stretch(0.5, 2, 1, 5, "mixed", 0.0) == stretch(0.5, 2, 1, 5, "fluid")
    assert stretch(0.5, 2, 1, 5, "mixed", 1.0) == stretch(0.5, 2, 1, 5, "per_core")
    assert stretch(0.5, 2, 2, 5, "mixed", 0.25) == pytest.approx(per_core, rel=1e-12)
    cost = HostCost(cores=2, replicas=2, law="mixed", per_core_share=0.25)
    assert cost.stretch_at(0.5, 1) == stretch(0.5, 2, 1, cost.path_processes, "mixed", 0.25)


def test_the_steps_see_the_streams_work_over_their_own_window_and_the_rest_over_the_paths():
    """The path's work for the tokens it streams weighs on the steps starting now over step_window_s
    (50 ms here), its requests' work and everything for the path's own latency over window_s (1 s); without
    a step window the steps read the path's load."""
    cost = HostCost(cores=2, replicas=2, cpu_s_per_request=0.01, cpu_s_per_token=0.001, path_processes=2)
    cost = dataclasses.replace(cost, step_window_s=0.05)
    host, plain = Host(cost), Host(dataclasses.replace(cost, step_window_s=None))
    for h in (host, plain):
        h.serve(1.0, requests=1, tokens=20)  # 0.01 + 0.02 CPU seconds
    assert host.load(1.0) == plain.load(1.0) == pytest.approx(0.03)
    assert plain.step_load(1.0) == pytest.approx(0.03)
    assert plain.step_load(2.0) == pytest.approx(0.03 / math.e)
    assert host.step_load(1.0) == pytest.approx(0.01 + 0.02 / 0.05)
    assert host.step_load(1.05) == pytest.approx(0.01 * math.exp(-0.05) + 0.4 / math.e)
    host.start(1.0, "a", 1.0)
    host.start(1.0, "b", 1.0)  # both stepping: they share what the steps' load leaves
    assert host.stretch(1.0) == pytest.approx(2 / (2 - 0.41))
    assert host.path_latency(1.0, 0.02, 0.01) == pytest.approx(0.01 + 0.01 * 2 / (2 - 0.03))


def test_a_sharing_measurement_sets_the_mixed_law_at_its_stand_ins_share_and_none_keeps_per_core():
    from bench.cost_profile import STEP_WINDOW_S, sharing_law

    def engine(alone: float, fluid: float, per_core: float) -> dict:
        return {"measured_alone": alone, "law_alone": {"fluid": fluid, "per_core": per_core}}

    sharing = {
        "regimes": [
            {"engines": [engine(1.1, 1.0, 1.2), engine(1.15, 1.0, 1.2)]},
            {"engines": [engine(1.2, 1.0, 1.4), engine(1.0, 1.0, 1.0)]},  # no room between: left out
        ]
    }
    assert sharing_law(sharing) == {"law": "mixed", "per_core_share": 0.583, "step_window_s": STEP_WINDOW_S}
    assert sharing_law(None) == {"law": "per_core", "per_core_share": 1.0, "step_window_s": None}


def test_each_engine_step_adds_its_cpu_to_the_serving_load_beside_its_tokens():
    cost = HostCost(cores=2, replicas=2, idle_cores=0.1, cpu_s_per_token=0.001, cpu_s_per_step=0.003)
    host = Host(cost)
    host.serve(1.0, tokens=4, steps=1)  # one step's 4 tokens: 0.004 + 0.003 CPU seconds
    assert host.load(1.0) == pytest.approx(0.1 + 0.007)
    # At steady rates the load settles to load_at's: 50 steps of 4 tokens a second.
    for k in range(1, 2001):
        host.serve(1.0 + k / 50, tokens=4, steps=1)
    settled = cost.load_at(0.0, 200.0, 50.0)
    assert settled == pytest.approx(0.1 + 0.2 + 0.15)
    assert host.load(41.0) == pytest.approx(settled, rel=0.02)


def test_in_the_cluster_every_step_on_a_host_counts_once_in_its_serving_load(monkeypatch):
    counted = []
    serve = Host.serve

    def counting(self, now, requests=0, tokens=0, steps=0):
        counted.append(steps)
        serve(self, now, requests, tokens, steps)

    monkeypatch.setattr(Host, "serve", counting)
    cost = HostCost(cores=2, replicas=3, idle_cores=0.2, cpu_s_per_token=0.001, cpu_s_per_step=0.002)
    cluster, _ = simulate("sla", profile=small_profile(host=cost))
    steps = sum(x.counters.steps for x in cluster.all_replicas())
    assert sum(counted) == steps > 0


def test_replicas_share_a_host_as_the_profile_places_them_and_a_replacement_takes_its_place():
    cost = HostCost(cores=2, replicas=2)
    config = ClusterConfig(
        fleet=[Group(small_profile(host=cost), 5)],
        classes=CLASSES,
        default_class="standard",
        failures=(Failure(1.0, 0, 1.0),),
    )
    cluster = Cluster(config, [])
    hosts = [cluster._host_of[r.replica_id] for r in cluster.replicas]
    assert (
        hosts[0] is hosts[1]
        and hosts[2] is hosts[3]
        and hosts[4] not in hosts[:4]
        and hosts[1] is not hosts[2]
    )
    cluster.run(5.0)
    fresh = next(r for r in cluster.replicas if "~" in r.replica_id)
    assert cluster._host_of[fresh.replica_id] is hosts[0]
    assert all(h.stepping == 0 for h in hosts)  # every step ended, the dead one's too


def test_with_a_host_the_run_is_still_conserved_and_deterministic_under_a_seed():
    cost = HostCost(
        cores=2,
        replicas=3,
        idle_cores=0.2,
        cpu_s_per_request=0.01,
        cpu_s_per_token=0.001,
        replica_cpu_s_per_request=0.002,
        replica_cpu_s_per_token=0.0005,
    )

    def fingerprint(seed):
        cluster, requests = simulate("sla", seed=seed, profile=small_profile(host=cost))
        assert all(r.outcome in ("done", "refused", "shed") for r in requests)
        done = [r for r in requests if r.outcome == "done"]
        generated = sum(x.counters.generated_tokens for x in cluster.all_replicas())
        assert generated == sum(r.generated for r in done)
        return [(r.outcome, r.replica, r.first_token, r.finish) for r in requests]

    assert fingerprint(5) == fingerprint(5)
    assert fingerprint(5) != fingerprint(6)


def test_the_measured_cpu_profile_has_a_host_and_the_gpu_profile_says_why_it_has_none():
    cpu = load("cpu_measured")
    assert cpu.host is not None and cpu.host.cores == 2 and cpu.host.cpu_s_per_token > 0
    gpu = load("gpu_dsv4flash_rocm")
    assert gpu.host is None
    assert any("host" in a for a in gpu.assumptions)


def test_a_profile_with_a_host_keeps_its_host_when_scaled():
    cost = HostCost(cores=2, replicas=2, cpu_s_per_token=0.001)
    assert dataclasses.replace(small_profile(host=cost)).scaled(2.0).host == cost


def test_the_cpu_profile_is_derived_from_the_committed_measurements():
    """The whole of cpu_measured.json is what bench/serving_cost.py --write-profile makes of the committed
    serving_cost.json and serve_proxy.json (and accept.json's rows, checked below): the host block,
    request_path_s and, once serving_cost.json has an engine sweep, the SPS table and the step terms
    fitted to it (tests/bench/test_serving_cost.py), and the host's law from host_sharing.json."""
    from bench.cost_profile import derive_profile, provenance

    root = Path(__file__).resolve().parents[2]
    measured = json.loads((root / "bench" / "results" / "serving_cost.json").read_text())
    serve = json.loads((root / "bench" / "results" / "serve_proxy.json").read_text())
    sharing = json.loads((root / "bench" / "results" / "host_sharing.json").read_text())
    committed = json.loads((root / "sim" / "profiles" / "cpu_measured.json").read_text())
    derived = derive_profile(committed, measured["serving"], serve, provenance(measured), sharing)
    assert derived == committed
    # As JSON (the tables of the path's remainder are lists there, tuples in HostCost).
    assert json.loads(json.dumps(dataclasses.asdict(load("cpu_measured").host))) == committed["host"]


def test_the_measured_profiles_acceptance_is_bench_accepts_dspark_rows_at_t1():
    from bench.cost_profile import acceptance_rows

    root = Path(__file__).resolve().parents[2]
    accept = json.loads((root / "bench" / "results" / "accept.json").read_text())
    committed = json.loads((root / "sim" / "profiles" / "cpu_measured.json").read_text())
    assert acceptance_rows(accept) == committed["acceptance"]
    assert set(committed["acceptance"]) == {"code", "prose"}


def test_the_paths_cpu_part_stretches_and_the_rest_does_not():
    assert path_latency(0.02, 0.005, 2.0) == pytest.approx(0.025, rel=1e-12)  # 15 ms waits, 5 ms CPU
    assert path_latency(0.02, 0.03, 1.5) == pytest.approx(0.03, rel=1e-12)  # CPU beyond it: all of it
    assert path_latency(0.02, 0.005, 1.0) == 0.02


def test_the_path_runs_at_the_engines_stretch_when_it_arrives():
    """A 2-core host with 0.5 cores of serving load, the path 20 ms of which 10 ms CPU. Per core the hop's
    core carries its share of that load however many engines step: its CPU at 2 / (2 - 0.5). Under the
    fluid law, with no engine stepping or one (a core to spare) the idle latency, with both stepping
    their stretch, 2 / (2 - 0.5)."""
    cost = HostCost(
        cores=2, replicas=2, idle_cores=0.5, cpu_s_per_request=0.008, replica_cpu_s_per_request=0.002
    )
    stretched = pytest.approx(0.01 + 0.01 * 2 / 1.5, rel=1e-12)
    per_core, fluid = Host(cost), Host(dataclasses.replace(cost, law="fluid"))
    for stepping in (0, 1, 2):
        if stepping:  # one more engine in a step on each host
            per_core.start(0.0, stepping, 0.01)
            fluid.start(0.0, stepping, 0.01)
        assert per_core.path_latency(0.0, 0.02) == stretched
        assert fluid.path_latency(0.0, 0.02) == (stretched if stepping == 2 else 0.02)
        assert per_core.path_latency(0.0, 0.02) == pytest.approx(
            per_core.stretch(0.0) * 0.01 + 0.01, rel=1e-12
        )
    assert Host(dataclasses.replace(cost, path_stretches=False)).path_latency(0.0, 0.02) == 0.02


def test_on_a_busy_host_the_path_stretches_and_ttft_adds_up_from_its_parts():
    """Every finished request's TTFT is its path, its queue and its prefill, none negative; the path is
    never below its idle latency and, with the engines stepping, above it for some requests."""
    cost = HostCost(cores=2, replicas=3, idle_cores=0.2, cpu_s_per_request=0.01, cpu_s_per_token=0.001)
    profile = small_profile(host=cost, request_path_s=0.015)
    _, requests = simulate("sla", seed=5, profile=profile)
    done = [r for r in requests if r.outcome == "done"]
    parts = [r.ttft_parts for r in done]
    assert done and all(p is not None and min(p) >= 0 for p in parts)
    assert all(sum(p) == pytest.approx(r.ttft, abs=1e-9) for p, r in zip(parts, done))
    paths = [p[0] for p in parts]
    assert min(paths) >= 0.015 - 1e-12 and max(paths) > 0.015 * 1.2
    _, flat = simulate(
        "sla",
        seed=5,
        profile=small_profile(host=dataclasses.replace(cost, path_stretches=False), request_path_s=0.015),
    )
    assert {round(r.ttft_parts[0], 9) for r in flat if r.outcome == "done"} == {0.015}


def test_groups_with_one_host_block_fill_its_hosts_in_fleet_order():
    """Two replicas that differ in max_num_seqs (two groups of one) share a host as two alike would."""
    cost = HostCost(cores=2, replicas=2)
    fleet = [Group(small_profile(host=cost, max_num_seqs=n), 1, name=f"x{n}") for n in (8, 2, 4)]
    cluster = Cluster(ClusterConfig(fleet=fleet, classes=CLASSES, default_class="standard"), [])
    hosts = [cluster._host_of[r.replica_id] for r in cluster.replicas]
    assert hosts[0] is hosts[1] and hosts[2] is not hosts[0]


def test_the_forward_rate_a_replica_publishes_is_its_forwards_wall_time_on_the_host():
    """The engine times its forwards by the wall clock: on a host with half a core for it they take
    twice the modelled time, and the router scales the table by the rate it publishes from that."""
    from deployments.replica_state import RecentForwards, RecentRounds
    from sim.stats import snapshot

    cost = HostCost(cores=1, replicas=1, idle_cores=0.5)  # the engine gets the other half of the core
    req = Request(rid=0, arrival=0.0, prompt_tokens=32, max_tokens=40, sla_class="standard", domain="easy")
    config = ClusterConfig(
        fleet=[Group(small_profile(host=cost), 1, "plain", drafting=False)],
        classes=CLASSES,
        default_class="standard",
        router="pow2",
    )
    cluster = Cluster(config, [req])
    cluster.run(100.0)
    (replica,) = cluster.replicas
    c = replica.counters
    assert c.forward_wall_s == pytest.approx(2 * c.forward_time_s)
    stats = snapshot(replica, RecentRounds(), cluster.q.now, RecentForwards())
    assert stats["recent_forward_sps"] == pytest.approx(c.steps / c.forward_wall_s, rel=1e-3)


def test_a_slower_machine_scales_every_cpu_cost_and_path_latency_and_keeps_the_layout_and_law():
    """bench/sim_validate.py's speed-matched comparison: the host `factor` times slower at CPU work."""
    profile = load("cpu_measured")
    host = profile.host
    slow = host.slowed(1.5)
    for name in ("idle_cores", "cpu_s_per_request", "cpu_s_per_token", "replica_cpu_s_per_request"):
        assert getattr(slow, name) == pytest.approx(1.5 * getattr(host, name))
    assert slow.replica_cpu_s_per_token == pytest.approx(1.5 * host.replica_cpu_s_per_token)
    assert slow.cpu_s_per_step == pytest.approx(1.5 * host.cpu_s_per_step)
    for table in ("path_in_beyond", "path_back_beyond"):
        got, was = getattr(slow, table), getattr(host, table)
        assert [n for n, _ in got] == [n for n, _ in was]  # the requests open stay counts
        assert [s for _, s in got] == pytest.approx([1.5 * s for _, s in was])
    for quantiles in ("path_in_jitter", "path_back_jitter"):
        assert getattr(slow, quantiles) == pytest.approx([1.5 * s for s in getattr(host, quantiles)])
    kept = ("cores", "replicas", "path_processes", "window_s", "step_window_s", "law", "per_core_share")
    assert all(getattr(slow, k) == getattr(host, k) for k in kept)
    assert host.slowed(1.0) == host
    with pytest.raises(ValueError, match="positive"):
        host.slowed(0.0)
    path = profile.path_slowed(1.5)
    assert path.request_path_s == pytest.approx(1.5 * profile.request_path_s)
    assert path.request_path_in_s == pytest.approx(1.5 * profile.request_path_in_s)
    assert path.host == slow
    # The engine's terms are untouched: its steps slow by the replicas' own factor (Group.slow).
    assert (path.sps_rates, path.forward_scale, path.draft_s_per_step) == (
        profile.sps_rates,
        profile.forward_scale,
        profile.draft_s_per_step,
    )
    assert small_profile(request_path_s=0.01).path_slowed(2.0).request_path_in_s is None


def test_on_a_machine_twice_as_slow_without_contention_a_lone_request_takes_twice_as_long():
    """With no host block (each engine on its own core) nothing but the machine's speed changes: the
    path's latency and every step double, so TTFT and TPOT do too; a factor of 1 changes nothing."""

    def alone(slow: float | None) -> Request:
        """The request alone; `slow` None: the profile and group as they are, without the factor."""
        req = Request(
            rid=0, arrival=0.0, prompt_tokens=32, max_tokens=30, sla_class="standard", domain="easy"
        )
        profile = small_profile(request_path_s=0.01, request_path_in_s=0.004)
        group = Group(profile, 1, "plain", drafting=False)
        if slow is not None:
            group = dataclasses.replace(group, profile=profile.path_slowed(slow), slow=slow)
        config = ClusterConfig(fleet=[group], classes=CLASSES, default_class="standard", router="pow2")
        Cluster(config, [req]).run(100.0)
        assert req.outcome == "done"
        return req

    base, same, slow = alone(None), alone(1.0), alone(2.0)
    assert (same.first_token, same.finish) == (base.first_token, base.finish)
    assert slow.first_token == pytest.approx(2 * base.first_token)
    assert tpot(slow) == pytest.approx(2 * tpot(base))
