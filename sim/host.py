"""A host's cores, shared by the engines placed on it and by the serving path's processes.

A profile's step times are one engine measured alone on its core. Served, a host also runs Serve's proxy,
the ingress, Ray's own processes and (in the validation) the client, and may run several engines on few
cores. With `stepping` engines of the host stepping (a step counts itself) and the serving path's
`path_processes` processes keeping `load` cores busy between them, an engine's share of a core follows
a law (`HostCost.law`):

- "per_core" (the default): each engine stepping holds a core, and the serving path's bursts land evenly
  on every core, the stepping engines' included, so each engine gets 1 - load / cores of its core whether
  or not the others step; with more engines stepping than cores they share what the path leaves,
  (cores - load) / stepping each;
- "fluid" (max-min fair with perfect balancing): the path's bursts go to whichever core is free and the
  engines share the rest, min(1, (cores - load) / stepping) each, so a step alone runs at full speed;
- "mixed" (the measured profile's): a step's stretch lies `per_core_share` of the way from the fluid
  law's to the per-core law's. The two agree once every core has an engine stepping; they part for a step
  with a core to spare.

Under all, when a path process wants more than an equal share, cores / (stepping + path_processes),
every runnable process gets that equal share. A step runs 1 / (its engine's share) times longer than
alone. bench/host_sharing.py measures the laws on this machine with stand-in engines and path processes
of known CPU (bench/results/host_sharing.md): the per-core law within a few per cent of every regime's
stretch, the fluid one low by 4-8 %; its stand-ins' steps alone paid 47-61 % of the per-core law's
stretch beyond the fluid law's (the path's bursts do not all find the free core, nor all land on the
busy ones): the measured profile's per_core_share is their mean (bench/cost_profile.py sharing_law).

The serving path's load is its measured CPU per request, per token and per engine step
(bench/serving_cost.py, bench/cost_profile.py path_load_fit) at the host's recent rates (an exponentially
decayed window of `window_s`), plus the stack's idle CPU (Ray, Serve's stats polling). The per-step term
is there because the path's CPU grows slower than its tokens: a step's tokens leave the replica together
and the hops behind it carry them in fewer wake-ups and messages the more requests a step serves (on this
machine, from 1 to 5.5 tokens a step, per token alone overstated the sweep's loads by up to 0.39 cores and
the validation's by 0.15; per token and per step fit them within 0.06 and 0.03).

The steps read the load's streaming part (per token and per step) over a shorter window where the
profile gives one (`step_window_s`): a token's hops run as its step ends, on the cores the steps want, so
the engines feel those bursts (a request's own hops run on its way in, before its engine sees it, and on
its way out: the steps read them over `window_s`, as the path's own latency model, fitted there, reads
all of it). On the real stack a request alone on its replica decodes 36 % slower beside a busy engine
than beside an idle one (bench/results/sim_arrivals.md); under the per-core law with the steps reading
1 s of the path's load the simulated one did 4 % slower, under the mixed law 10 %, and reading 50 ms of
the streaming part 25 %.

The serving work inside a replica's own process (Serve's request handling, streaming each token out) is
part of that load: its threads compete with the engine's for a core, they do not hold the engine up.
bench/results/serving_cost.json measures it so: in every engine run the engine thread's step wall is its
CPU plus its wait for a CPU (engine_run_delay_s, about 40% of the wall at about 1.93 busy cores) and
nothing else (engine_blocked_s, off a CPU without waiting for one, i.e. the interpreter lock, is within
+-0.07 s of 0 out of 5-14 s), while those threads used 0.3-1.2 s of CPU.

The serving path's latency stretches too: it is mostly CPU (its measured CPU per request is about its
whole latency at idle), and since the serving threads run SCHED_BATCH (deployments/thread_policy.py) a hop
that wakes while the engines step waits for a core like any CPU-bound thread. So the CPU part of the
path's idle latency (its measured CPU per request, at most that latency) runs at the stretch of CPU work
on the host when the request arrives: the engines' own stretch with those stepping then (at least one
runnable: the hop itself), and the rest of it (waits that are not CPU) as measured (`path_latency`).
The path's work is placed on the fleet's first host (the measured layout: proxy and ingress beside the
engines of the one host). A profile that measured the path's way in (`request_path_in_s`) splits it
(`path_parts`): the way in stretches at the host's contention when the request arrives, the way back
(the first token to the client) at the contention when the engine produced that token.

The engines' steps share the cores as processes do (processor sharing): a step's work is its time alone,
and whenever a step on the host starts or ends, every step in flight there goes on at the stretch of the
new mix (`start`, `finish`), so a step that started alone slows down when another starts beside it. The
serving path's load is read at those moments too (over `step_window_s`, or `window_s`).
GPU profiles have no host block: there the step runs on the accelerator and the serving path on the
node's CPUs (the profile states it).

The CPU-stretch model leaves out what the serving path's processes queue for: they are event loops that
carry every open stream's tokens and every new request's hops, so a hop waits behind the others' work,
more of it the more requests are open (the validation's host_check in the sitting of 2026-12-01 11:15:
the way in measured 26 / 39 / 63 / 99 ms at 2 / 4 / 8 / 12 requests open against the CPU-stretch model's
24 / 25 / 28 / 30; each sitting's are in bench/results/sim.json). A profile
measured with an engine sweep carries that remainder as measured (`path_in_beyond`, `path_back_beyond`:
each direction's mean latency beyond the CPU-stretch model, by the requests open on the path, from the
sweep's closed-loop runs; bench/cost_profile.py path_beyond), and the path's latency adds it at the
requests open when the request arrives (the way in) or its first token comes out (the way back),
interpolated between the measured counts and held at the ends (`beyond`). Measured on open-loop runs, the
table is a mean: each request's path also draws its own deviation from it from the measured requests'
(`path_in_jitter`, `path_back_jitter`, `jitter`), so the path's latency has the measured spread, not one
value per load. A host whose path does not stretch (`path_stretches` False) takes none of this: its path
is its idle latency.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class HostCost:
    """Measured serving-path costs of a host (a profile's `host` block)."""

    cores: int  # CPU cores the engines and the serving path share
    replicas: int  # engines placed on one host (the measured layout)
    idle_cores: float = 0.0  # CPU the served stack takes with no traffic (Ray, Serve's stats polling)
    cpu_s_per_request: float = 0.0  # proxy, ingress, client and Ray per request, beside the engines
    cpu_s_per_token: float = 0.0  # the same per generated token (one stream message each)
    replica_cpu_s_per_request: float = 0.0  # in the replica's process, outside the engine's thread
    replica_cpu_s_per_token: float = 0.0  # (part of the serving path's load, beside the above)
    cpu_s_per_step: float = 0.0  # the path's CPU per engine step (a step's tokens go out together)
    path_processes: int = 1  # processes (or groups of threads) the serving path's load is spread over
    window_s: float = 1.0  # how far back the serving path's load is averaged (for its own latency)
    # ... and for the steps it competes with, its streaming part (None: window_s): a token's hops land on
    # the steps they coincide with, so the steps see a shorter window of them (module docstring).
    step_window_s: float | None = None
    path_stretches: bool = True  # the path's CPU stretches with the host's (False: its idle latency)
    law: str = "per_core"  # how the engines share the cores with the path (module docstring)
    per_core_share: float = 1.0  # law "mixed": a step's stretch that far from the fluid law's to per_core's
    # The path's latency beyond the CPU-stretch model by the requests open on it, ((open, seconds), ...)
    # ascending in open, each direction's (module docstring); empty: none measured.
    path_in_beyond: tuple[tuple[int, float], ...] = ()
    path_back_beyond: tuple[tuple[int, float], ...] = ()
    # Each direction's spread around that table, request to request: quantiles (evenly spaced from the
    # least to the most) of the measured requests' latency less the table's mean at their count; each
    # request's path draws one (`jitter`). Empty: none measured, every request takes the table's mean.
    path_in_jitter: tuple[float, ...] = ()
    path_back_jitter: tuple[float, ...] = ()

    def stretch_at(self, load: float, stepping: int) -> float:
        """A step's stretch under this host's law with the path keeping `load` cores busy (`stretch`)."""
        return stretch(load, self.cores, stepping, self.path_processes, self.law, self.per_core_share)

    def slowed(self, factor: float) -> HostCost:
        """The same host `factor` times slower at CPU work (a machine whose speed drifted): every CPU cost
        and every measured latency of the path scaled by it; its cores, layout, law and windows kept."""
        if factor <= 0:
            raise ValueError(f"a host's slow-down factor must be positive, got {factor}")
        return replace(
            self,
            idle_cores=self.idle_cores * factor,
            cpu_s_per_request=self.cpu_s_per_request * factor,
            cpu_s_per_token=self.cpu_s_per_token * factor,
            replica_cpu_s_per_request=self.replica_cpu_s_per_request * factor,
            replica_cpu_s_per_token=self.replica_cpu_s_per_token * factor,
            cpu_s_per_step=self.cpu_s_per_step * factor,
            path_in_beyond=tuple((n, s * factor) for n, s in self.path_in_beyond),
            path_back_beyond=tuple((n, s * factor) for n, s in self.path_back_beyond),
            path_in_jitter=tuple(s * factor for s in self.path_in_jitter),
            path_back_jitter=tuple(s * factor for s in self.path_back_jitter),
        )

    @property
    def path_cpu_s(self) -> float:
        """The serving path's CPU per request (all its processes, the replica's serving threads too)."""
        return self.cpu_s_per_request + self.replica_cpu_s_per_request

    def load_at(self, requests_per_s: float, tokens_per_s: float, steps_per_s: float) -> float:
        """Cores the serving path keeps busy at steady rates (what Host.load settles to), the idle stack's
        included."""
        per_request = self.cpu_s_per_request + self.replica_cpu_s_per_request
        per_token = self.cpu_s_per_token + self.replica_cpu_s_per_token
        rates = requests_per_s * per_request + tokens_per_s * per_token + steps_per_s * self.cpu_s_per_step
        return self.idle_cores + rates

    @classmethod
    def from_json(cls, data: dict | None) -> HostCost | None:
        if not data:
            return None
        fields = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        for k in ("path_in_beyond", "path_back_beyond"):  # JSON lists, kept as tuples (hashable)
            if k in fields:
                fields[k] = tuple((int(n), float(s)) for n, s in fields[k])
        for k in ("path_in_jitter", "path_back_jitter"):
            if k in fields:
                fields[k] = tuple(float(s) for s in fields[k])
        return cls(**fields)


class Host:
    """One host's cores: the engines stepping on it and the serving path's recent CPU rate."""

    __slots__ = (
        "cost",
        "_work",
        "_request_work",
        "_stream_work",
        "_at",
        "_left",
        "_since",
        "_stretch",
    )

    def __init__(self, cost: HostCost) -> None:
        self.cost = cost
        # Serving-path CPU seconds, exponentially decayed to time _at: all of it over window_s (the path's
        # own latency reads it), and, with a steps' window, for the steps' stretch its requests' part over
        # window_s and its streams' part (per token and per step) over the steps' window.
        self._work = self._request_work = self._stream_work = 0.0
        self._at = 0.0
        self._left: dict[Hashable, float] = {}  # each step in flight: its work left, in seconds alone
        self._since = 0.0  # when the steps in flight last changed
        self._stretch = 1.0  # ... and the stretch they have run at since

    @property
    def stepping(self) -> int:
        """Engines of the host in a step now."""
        return len(self._left)

    def start(self, now: float, key: Hashable, alone_s: float) -> dict[Hashable, float]:
        """A step taking `alone_s` alone on a core starts now; returns when each step in flight ends."""
        self._advance(now)
        self._left[key] = alone_s
        return self._ends(now)

    def finish(self, now: float, key: Hashable) -> dict[Hashable, float]:
        """The step `key` ended (or its engine died): returns when each other step in flight ends."""
        self._advance(now)
        self._left.pop(key, None)
        return self._ends(now)

    def _advance(self, now: float) -> None:
        """Take the work done since the last change, at the stretch it ran at, off every step in flight."""
        done = (now - self._since) / self._stretch
        for key, left in self._left.items():
            self._left[key] = max(0.0, left - done)
        self._since = now

    def _ends(self, now: float) -> dict[Hashable, float]:
        if not self._left:
            return {}
        self._stretch = self.stretch(now)
        return {key: now + left * self._stretch for key, left in self._left.items()}

    def _decayed(self, now: float, work: float, window: float) -> float:
        return work * math.exp(-(now - self._at) / window) if now > self._at else work

    def serve(self, now: float, requests: int = 0, tokens: int = 0, steps: int = 0) -> None:
        """The serving path handled `requests` new requests and streamed `tokens` tokens of `steps` engine
        steps at `now`."""
        c = self.cost
        per_request = c.cpu_s_per_request + c.replica_cpu_s_per_request
        per_token = c.cpu_s_per_token + c.replica_cpu_s_per_token
        request_work, stream_work = requests * per_request, tokens * per_token + steps * c.cpu_s_per_step
        self._work = self._decayed(now, self._work, c.window_s) + request_work + stream_work
        if c.step_window_s is not None:  # without one the steps read the path's own load
            self._request_work = self._decayed(now, self._request_work, c.window_s) + request_work
            self._stream_work = self._decayed(now, self._stream_work, c.step_window_s) + stream_work
        self._at = max(self._at, now)

    def load(self, now: float) -> float:
        """Cores the serving path keeps busy now (its recent CPU rate over window_s plus the idle stack)."""
        return self.cost.idle_cores + self._decayed(now, self._work, self.cost.window_s) / self.cost.window_s

    def step_load(self, now: float) -> float:
        """The load a step starting now meets: the streams' part of the path's work over the steps' window
        (HostCost.step_window_s; their hops run as the steps end), the requests' over window_s (their
        hops run on their way in, before their engine sees them, and on their way out), the idle stack."""
        c, window = self.cost, self.cost.step_window_s
        if window is None:  # one window: the path's own load, to the last bit
            return self.load(now)
        requests = self._decayed(now, self._request_work, c.window_s) / c.window_s
        return c.idle_cores + requests + self._decayed(now, self._stream_work, window) / window

    def stretch(self, now: float) -> float:
        """How much longer than alone a step starting now runs (with `stepping` counting it)."""
        return self.cost.stretch_at(self.step_load(now), self.stepping)

    def path_latency(
        self,
        now: float,
        idle_s: float,
        cpu_s: float | None = None,
        beyond_table: tuple[tuple[int, float], ...] = (),
        open_requests: int = 1,
    ) -> float:
        """The serving path's latency (or a part's) starting now: `idle_s` at idle, `cpu_s` of CPU in it
        (the whole path's, HostCost.path_cpu_s, unless given; path_latency), and with `open_requests` on
        the path the part's measured latency beyond that (`beyond_table`, one of HostCost's
        path_*_beyond; `beyond`), never below 0."""
        if not self.cost.path_stretches:
            return idle_s
        c = self.cost
        cpu_stretch = c.stretch_at(self.load(now), max(1, self.stepping))
        stretched = path_latency(idle_s, c.path_cpu_s if cpu_s is None else cpu_s, cpu_stretch)
        return max(0.0, stretched + beyond(beyond_table, open_requests))


def stretch(
    load: float,
    cores: int,
    stepping: int,
    path_processes: int,
    law: str = "per_core",
    per_core_share: float = 1.0,
) -> float:
    """A step's wall over its time alone with `stepping` engines stepping (itself included) and the serving
    path's `path_processes` keeping `load` cores busy, under `law` (the module docstring's; "mixed": the
    fluid law's stretch plus `per_core_share` of the way to the per-core law's)."""
    equal = cores / (stepping + path_processes)
    if load / path_processes > equal:
        return max(1.0, 1.0 / equal)
    if law == "per_core":
        return max(1.0, max(stepping, cores) / (cores - load))
    if law == "fluid":
        return max(1.0, stepping / (cores - load))
    if law == "mixed":
        fluid = max(1.0, stepping / (cores - load))
        return fluid + per_core_share * (max(1.0, max(stepping, cores) / (cores - load)) - fluid)
    raise ValueError(f"unknown host sharing law {law!r}")


def path_latency(idle_s: float, cpu_s: float, cpu_stretch: float) -> float:
    """The serving path's latency when CPU work runs `cpu_stretch` times longer than alone: of its idle
    latency `idle_s`, the CPU part (`cpu_s`, at most all of it) stretches and the rest does not."""
    cpu = min(idle_s, cpu_s)
    return idle_s - cpu + cpu * cpu_stretch


def beyond(table: tuple[tuple[int, float], ...], open_requests: int) -> float:
    """The path's latency beyond the CPU-stretch model with `open_requests` open (a HostCost table):
    linear between the measured counts, held at the nearest end outside them; 0 without a table."""
    if not table:
        return 0.0
    if open_requests <= table[0][0]:
        return table[0][1]
    for (n0, s0), (n1, s1) in zip(table, table[1:]):
        if open_requests <= n1:
            return s0 + (s1 - s0) * (open_requests - n0) / (n1 - n0)
    return table[-1][1]


def jitter(quantiles: tuple[float, ...], u: float) -> float:
    """The draw at `u` (uniform in [0, 1)) from a distribution given by its evenly spaced quantiles (the
    least first, the most last), linear between them; 0 without any."""
    if not quantiles:
        return 0.0
    if len(quantiles) == 1:
        return quantiles[0]
    at = u * (len(quantiles) - 1)
    i = min(int(at), len(quantiles) - 2)
    return quantiles[i] + (quantiles[i + 1] - quantiles[i]) * (at - i)


def path_parts(
    path_s: float, inbound_s: float, cpu_s: float
) -> tuple[tuple[float, float], tuple[float, float]]:
    """The serving path split into its way in (arrival to the replica) and its way back (the first token to
    the client): ((idle latency, CPU) in, (idle latency, CPU) back) from the whole path's idle latency
    `path_s`, its way in's `inbound_s` (cut to the path) and its CPU per request `cpu_s`. The CPU is
    measured for the whole path only (per process, not per direction), so each part gets its latency's
    share of it: with the path's CPU at least its latency (as measured) both parts are all CPU, and at
    any one stretch the two parts' latencies add up to the whole path's (path_latency is linear in it)."""
    inbound = min(max(0.0, inbound_s), path_s)
    back = path_s - inbound
    share = cpu_s / path_s if path_s > 0 else 0.0
    return (inbound, inbound * share), (back, back * share)
