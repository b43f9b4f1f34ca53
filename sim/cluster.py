"""The cluster: arrivals, a router arm, replicas stepping, stats published with delay, failures.

Timing follows the real stack. Each replica publishes its routing stats every `stats_period_s` (the
app's `routing_stats_period_s`, 0.25 s by default) at its own phase; the router sees a snapshot
`stats_delay_s` later (Serve's controller polls the replica and broadcasts to the routers). A request
goes to the first replica of the arm's ranking that has a free slot (Serve's max_ongoing_requests: each
replica's max_num_seqs, or one value for the deployment, whose engine refuses what it has no sequence
slot for: a 429); with none, it waits in the router's queue and is routed again whenever a slot frees, as
Serve backs off and retries. The engine may still refuse it (KV exhausted): a 429 to the client.
Failures kill a replica's requests and bring a fresh replica (new id, no stats yet) after a downtime.
A profile that measured the machine's speed wander (`step_noise`) has each step's time multiplied by its
host's speed when it starts (sim/noise.py): one wander per host, or per replica without a host block.
Replicas of a profile with a host block are placed `host.replicas` to a host in fleet order (across
groups with the same host block), whose cores they share with the serving path (sim/host.py); a
replacement takes its predecessor's place. There the serving path's latency stretches with the host's
contention (sim/host.py), and by what its processes queue for with the requests open on it, where the
profile measured that (sim/host.py beyond), each request with its own deviation from that mean where the
profile measured their spread (sim/host.py jitter). A profile that measured the path's way in
(`request_path_in_s`) has the router see a request at the end of it and the engine's first token reach
the client the rest of the path later (every later token as much later: TPOT keeps); without it the
whole path comes before the router. Each
request records when its replica took it and ran its first prompt chunk (TTFT in parts:
Request.ttft_parts).
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from deployments.replica_state import RecentForwards, RecentRounds
from dspark.draft_budget import DraftBudget
from router.policy import PolicyConfig, Sla
from sim.events import EventQueue
from sim.host import Host, jitter, path_parts
from sim.noise import Wander
from sim.profiles import Profile
from sim.replica import Plan, SimReplica
from sim.routing import PowerOfTwo, RoundRobin, SlaArm
from sim.stats import snapshot
from sim.workload import Request


@dataclass(frozen=True)
class Group:
    """Identical replicas of a heterogeneous fleet."""

    profile: Profile
    count: int
    scheduler: str = "dspark"  # the engine's verify-length mode: dspark | fixed | plain | ...
    drafting: bool = True
    slow: float = 1.0  # step-time multiplier: a slow node
    draft_gate: bool = True
    name: str = ""


@dataclass(frozen=True)
class Failure:
    at_s: float
    replica: int  # index in the fleet
    downtime_s: float = 30.0


@dataclass(frozen=True)
class ClusterConfig:
    fleet: Sequence[Group]
    classes: Mapping[str, Sla]
    default_class: str
    router: str = "sla"
    stats_period_s: float = 0.25
    stats_delay_s: float = 0.05
    # Replicas the SLA arm's router draws and scores per request (PolicyConfig.candidates, router/
    # candidates.py; None: all). 8: at 100 GPU-class replicas and 80% load (12 s traces, 6 seeded runs of
    # the engine and controller arms) it matched 16's attainment (mean difference +0.00 points, pairs
    # within +-0.4) at a third less decision time; 4 was 0.2 points lower.
    candidates: int | None = 8
    # The SLA arm scales its TPOT by each replica's published decode steps (PolicyConfig.calibrate_tpot).
    calibrate_tpot: bool = False
    # The SLA arm's whole policy configuration, when not the defaults (calibrate_tpot above then unused).
    policy: PolicyConfig | None = None
    # Serve's max_ongoing_requests, one value for every replica (deployments/config.py); None: each
    # replica's own max_num_seqs.
    max_ongoing_requests: int | None = None
    failures: Sequence[Failure] = ()
    seed: int = 0
    timeline_period_s: float = 1.0
    # The budget loop: called every `control_period_s` with (now, replicas, requests each replica finished
    # since the last call) -> {replica id: DraftBudget} (sim/control.py).
    controller: (
        Callable[[float, list[SimReplica], Mapping[str, list[Request]]], Mapping[str, DraftBudget]] | None
    ) = None
    control_period_s: float = 2.0


@dataclass
class Timeline:
    t: list[float] = field(default_factory=list)
    tokens_per_s: list[float] = field(default_factory=list)
    verify_per_round: list[float] = field(default_factory=list)  # mean verified drafts per request-round
    running: list[int] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)


class Cluster:
    def __init__(self, config: ClusterConfig, requests: list[Request]) -> None:
        self.config = config
        self.requests = requests
        self.q = EventQueue()
        self.rng = random.Random(config.seed)
        self.replicas: list[SimReplica] = []  # the live fleet: a failed replica leaves it
        self.replica_ids: list[str] = []  # theirs, in the same order (the SLA arm draws from it)
        self._by_id: dict[str, SimReplica] = {}
        self._group_of: dict[str, Group] = {}
        self._host_of: dict[str, Host] = {}
        self._path_host: Host | None = None  # where the serving path runs: the fleet's first host
        host, placed = None, 0  # the host being filled, and the replicas on it
        for g, group in enumerate(config.fleet):
            cost = group.profile.host
            for i in range(group.count):
                replica = self._add(group, f"{group.name or group.profile.name}-{g}.{i}")
                if cost is not None:
                    # In fleet order, across groups of the same host block: two groups of one replica
                    # each (different max_num_seqs) share a host as one group of two would.
                    if host is None or host.cost != cost or placed == cost.replicas:
                        host, placed = Host(cost), 0
                    placed += 1
                    self._host_of[replica.replica_id] = host
                    self._path_host = self._path_host or host
        self._visible: dict[str, dict] = {}
        self._recent: dict[str, RecentRounds] = {}
        self._forwards: dict[str, RecentForwards] = {}
        self._dead: set[str] = set()
        # Steps in flight on a host, by replica, and the token of each one's current end event: its end
        # moves whenever another step on its host starts or ends (sim/host.py).
        self._running: dict[str, tuple[SimReplica, Plan]] = {}
        self._end_token: dict[str, int] = {}
        # Each host's speed wander (sim/noise.py), or each replica's without a host: made at its first step.
        self._wander: dict[object, Wander] = {}
        self.waiting: deque[Request] = deque()
        # Free sequence slots over the live fleet: whether a waiting request could go anywhere, in O(1).
        self.free_slots = sum(r.max_ongoing for r in self.replicas)
        self.router = self._make_router()
        self.timeline = Timeline()
        self._last_tokens = 0
        self._last_rounds = (0, 0)
        self.retired: list[SimReplica] = []
        self._finished: dict[str, list[Request]] = {}  # since the last control period, by replica
        self._inbound, self._back = self._path_parts()
        # Each request's path draws its deviation from the measured spread (HostCost.path_*_jitter), from
        # its own stream: a profile without a spread draws nothing and runs as before.
        cost = config.fleet[0].profile.host if config.fleet else None
        self._jitters = (cost.path_in_jitter, cost.path_back_jitter) if cost is not None else ((), ())
        self._jitter_rng = random.Random(f"path-jitter-{config.seed}")
        self.open_on_path = 0  # requests arrived on a host's serving path and not yet ended (sim/host.py)

    def _add(self, group: Group, replica_id: str) -> SimReplica:
        replica = SimReplica(
            replica_id,
            group.profile,
            group.scheduler,
            group.drafting,
            group.slow,
            seed=self.rng.getrandbits(32),
            draft_gate=group.draft_gate,
            max_ongoing=self.config.max_ongoing_requests,
        )
        self.replicas.append(replica)
        self.replica_ids.append(replica_id)
        self._by_id[replica_id] = replica
        self._group_of[replica_id] = group
        return replica

    def _make_router(self):
        c = self.config
        if c.router == "pow2":
            return PowerOfTwo(c.seed)
        if c.router == "round_robin":
            return RoundRobin()
        if c.router == "sla":
            config = c.policy or PolicyConfig(calibrate_tpot=c.calibrate_tpot)
            # The frontend names prompts' pages when its replicas cache prefixes (their info says so).
            first = c.fleet[0].profile if c.fleet else None
            page_size = first.page_size if first is not None and first.prefix_caching else None
            args = (c.classes, c.default_class, self._visible.get, c.seed, c.candidates, config)
            return SlaArm(*args, page_size=page_size, replica_ids=self.replica_ids)
        raise ValueError(f"unknown router arm {c.router!r}")

    # ---- the run ------------------------------------------------------------------------------------

    def run(self, until: float, tick: Callable[[float], None] | None = None) -> None:
        # The serving path (client, proxy, ingress, the stream's hops back): the fleet's first profile's.
        # Its way in ends where the replica receives the request (the router decided on the way); its way
        # back delays the first token to the client. Unsplit, the whole path comes before the router.
        for req in self.requests:
            self.submit(req)
        for replica in self.replicas:
            self._start_publishing(replica)
        for f in self.config.failures:
            self.q.at(f.at_s, self._fail, f)
        self.q.at(0.0, self._sample_timeline)
        if self.config.controller is not None:
            self.q.at(self.config.control_period_s, self._control)
        self.q.run(until, tick)

    def submit(self, req: Request) -> None:
        """`req` arrives at its `arrival` (now or later): the trace's requests as the run starts, and a
        closed-loop client's next ones as it goes (bench/route_sim.py)."""
        if self._path_host is None:  # its own CPUs: the path takes its measured time
            self.q.at(req.arrival + self._inbound[0], self._route, req)
        else:  # on a host: as long as the host's contention makes it when the request arrives
            self.q.at(req.arrival, self._arrive, req)

    def _alive(self) -> list[SimReplica]:
        # Kept, not rebuilt per request: at 1,000 replicas a per-request scan of the fleet cost more
        # than the decision itself. The arms only read it.
        return self.replicas

    def _path_parts(self) -> tuple[tuple, tuple]:
        """((idle latency, CPU, latency beyond by requests open) of the way in, the same of the way back)
        (sim/host.py path_parts, HostCost.path_in_beyond / path_back_beyond)."""
        if not self.config.fleet:
            return (0.0, 0.0, ()), (0.0, 0.0, ())
        profile = self.config.fleet[0].profile
        host = profile.host
        cpu = host.path_cpu_s if host is not None else 0.0
        tables = (host.path_in_beyond, host.path_back_beyond) if host is not None else ((), ())
        if profile.request_path_in_s is None:
            inbound, back = (profile.request_path_s, cpu), (0.0, 0.0)
        else:
            inbound, back = path_parts(profile.request_path_s, profile.request_path_in_s, cpu)
        return (*inbound, tables[0]), (*back, tables[1])

    def _arrive(self, req: Request) -> None:
        host = self._path_host
        assert host is not None
        self.open_on_path += 1
        latency = host.path_latency(self.q.now, *self._inbound, self.open_on_path)
        self.q.after(self._jittered(latency, self._jitters[0]), self._route, req)

    def _ended(self, count: int = 1) -> None:
        """`count` requests that came in over a host's serving path ended (done, shed, refused, failed)."""
        if self._path_host is not None:
            self.open_on_path -= count

    def _return(self, first: list[Request], done: list[Request]) -> None:
        """The first token's way back to the client: each request's first token (and so every later one,
        its finish too) reaches the client that much later; TPOT keeps."""
        for req in first:
            host = self._path_host
            if host is None:
                req.path_back = self._back[0]
            else:
                latency = host.path_latency(self.q.now, *self._back, self.open_on_path)
                req.path_back = self._jittered(latency, self._jitters[1])
            req.first_token += req.path_back
        for req in done:
            req.finish += req.path_back

    def _jittered(self, latency: float, quantiles: tuple[float, ...]) -> float:
        """`latency` with one draw of the measured spread around it added (never below 0)."""
        if not quantiles:
            return latency
        return max(0.0, latency + jitter(quantiles, self._jitter_rng.random()))

    def _route(self, req: Request) -> None:
        if req.outcome != "pending":
            return
        choice = self.router.choose(req, self._alive(), self.q.now)
        if choice.action == "shed":
            req.outcome, req.finish = "shed", self.q.now
            self._ended()
            return
        for replica_id in choice.ranking:
            replica = self._by_id.get(replica_id)
            if replica is None or not replica.has_slot():
                continue  # Serve tries the next choice when the first is at max_ongoing_requests
            refusal = replica.admit(req)
            if refusal is not None:  # the engine's own refusal: KV exhausted -> 429
                req.outcome, req.finish = "refused", self.q.now
                self._ended()
                return
            self.free_slots -= 1
            req.admitted = self.q.now
            host = self._host_of.get(replica_id)
            if host is not None:
                host.serve(self.q.now, requests=1)
            self.router.routed(replica_id, req, self.q.now)
            if not replica.stepping:
                self._step(replica)
            return
        self.waiting.append(req)

    def _retry_waiting(self) -> None:
        for _ in range(len(self.waiting)):
            if self.free_slots <= 0:
                return
            req = self.waiting.popleft()
            before = len(self.waiting)
            self._route(req)
            if len(self.waiting) > before:  # still no room for the head: keep FIFO order, stop
                self.waiting.rotate(1)
                return

    def _step(self, replica: SimReplica) -> None:
        plan = replica.plan()
        if plan is None:
            replica.stepping = False
            return
        replica.stepping = True
        for s, _ in plan.chunks:
            if s.req.scheduled is None:  # its first prompt chunk
                s.req.scheduled = self.q.now
        host = self._host_of.get(replica.replica_id)
        noise = replica.profile.step_noise
        if noise is not None:  # the machine's speed now: the step's work at it (sim/noise.py)
            key = host if host is not None else replica.replica_id
            wander = self._wander.get(key)
            if wander is None:
                rng = random.Random(f"wander-{self.config.seed}-{len(self._wander)}")
                wander = self._wander[key] = Wander(noise, rng, self.q.now)
            factor = wander.factor(self.q.now)
            plan.seconds *= factor
            plan.forward_seconds *= factor
            plan.draft_seconds *= factor
        if host is None:
            self.q.after(plan.seconds, self._end_step, replica, plan)
            return
        plan.started = self.q.now
        self._running[replica.replica_id] = (replica, plan)
        self._reschedule(host.start(self.q.now, replica.replica_id, plan.seconds))

    def _reschedule(self, ends: dict[str, float]) -> None:
        """The steps in flight on a host end at these times now (sim/host.py): earlier end events go stale."""
        for rid, end in ends.items():
            replica, plan = self._running[rid]
            self._end_token[rid] = token = self._end_token.get(rid, 0) + 1
            self.q.at(end, self._end_step, replica, plan, token)

    def _end_step(self, replica: SimReplica, plan: Plan, token: int = 0) -> None:
        rid = replica.replica_id
        if not replica.alive or token != self._end_token.get(rid, 0):
            return  # it died during the step (_fail took it off its host), or its end moved
        host = self._host_of.get(rid)
        if host is not None:
            del self._running[rid]
            alone = plan.seconds
            plan.seconds = self.q.now - plan.started
            plan.stretch = plan.seconds / alone if alone > 0 else 1.0
            self._reschedule(host.finish(self.q.now, rid))
        tokens = replica.counters.generated_tokens
        first, done = replica.complete(plan, self.q.now)
        if host is not None:
            host.serve(self.q.now, tokens=replica.counters.generated_tokens - tokens, steps=1)
        self.free_slots += len(done)
        self._ended(len(done))
        for req in done:
            self.router.completed(replica.replica_id, req, self.q.now)
        if done and self.config.controller is not None:
            self._finished.setdefault(replica.replica_id, []).extend(done)
        self._step(replica)
        if self._back[0] > 0:  # after the replica's next step started: the token goes out beside it
            self._return(first, done)
        if done and self.waiting:
            self._retry_waiting()

    # ---- stats, failures, control ------------------------------------------------------------------

    def _start_publishing(self, replica: SimReplica) -> None:
        self._recent[replica.replica_id] = RecentRounds()
        self._forwards[replica.replica_id] = RecentForwards()
        self.q.after(self.rng.random() * self.config.stats_period_s, self._publish, replica)

    def _publish(self, replica: SimReplica) -> None:
        if not replica.alive:
            return
        rid = replica.replica_id
        stats = snapshot(replica, self._recent[rid], self.q.now, self._forwards[rid])
        self.q.after(self.config.stats_delay_s, self._deliver, replica.replica_id, stats)
        self.q.after(self.config.stats_period_s, self._publish, replica)

    def _deliver(self, replica_id: str, stats: dict) -> None:
        if replica_id in self._dead:
            return  # the replica died meanwhile
        self._visible[replica_id] = stats

    def _fail(self, f: Failure) -> None:
        alive = self._alive()
        if not alive:
            return
        replica = alive[f.replica % len(alive)]
        self.free_slots -= replica.max_ongoing - len(replica.seqs)
        host = self._host_of.get(replica.replica_id)
        if host is not None and self._running.pop(replica.replica_id, None) is not None:
            self._reschedule(host.finish(self.q.now, replica.replica_id))
        self._ended(len(replica.seqs))
        replica.fail(self.q.now)
        self._dead.add(replica.replica_id)
        self._visible.pop(replica.replica_id, None)
        self.router.forget(replica.replica_id)
        self.retired.append(replica)
        self.replicas.remove(replica)
        self.replica_ids.remove(replica.replica_id)
        del self._by_id[replica.replica_id]
        self.q.after(f.downtime_s, self._replace, replica)

    def _replace(self, dead: SimReplica) -> None:
        group = self._group_of[dead.replica_id]
        fresh = self._add(group, f"{dead.replica_id}~{len(self.retired)}")
        if dead.replica_id in self._host_of:
            self._host_of[fresh.replica_id] = self._host_of[dead.replica_id]
        self.free_slots += fresh.max_ongoing
        self._start_publishing(fresh)
        self._retry_waiting()

    def _control(self) -> None:
        assert self.config.controller is not None
        finished, self._finished = self._finished, {}
        for replica_id, budget in self.config.controller(self.q.now, list(self.replicas), finished).items():
            if replica_id in self._by_id:
                self._by_id[replica_id].set_draft_budget(budget)
        self.q.after(self.config.control_period_s, self._control)

    def _sample_timeline(self) -> None:
        reps = self.replicas + self.retired
        tokens = sum(r.counters.generated_tokens for r in reps)
        rounds = sum(r.counters.rounds for r in reps)
        drafted = sum(r.counters.drafted_tokens for r in reps)
        period = self.config.timeline_period_s
        d_rounds = rounds - self._last_rounds[0]
        tl = self.timeline
        tl.t.append(self.q.now)
        tl.tokens_per_s.append((tokens - self._last_tokens) / period if tl.t[1:] else 0.0)
        tl.verify_per_round.append((drafted - self._last_rounds[1]) / d_rounds if d_rounds else 0.0)
        tl.running.append(sum(len(r.seqs) for r in self.replicas))
        tl.waiting.append(len(self.waiting))
        self._last_tokens, self._last_rounds = tokens, (rounds, drafted)
        self.q.after(period, self._sample_timeline)

    def all_replicas(self) -> list[SimReplica]:
        return self.replicas + self.retired
