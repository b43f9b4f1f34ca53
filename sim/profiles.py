"""Cost and acceptance profiles: what one replica's steps cost and how often drafts are accepted.

A profile is a data file under sim/profiles/ citing its sources and stating its assumptions. A step of B
tokens over N decoding requests, n of them drafting, takes

    forward_scale (1 / SPS(B) + attention) + step_overhead + N request_overhead + B token_overhead
      + C chunk_overhead + (draft_s_per_step + n draft_s_per_request, when anything is drafted)

seconds, C of its requests running a prompt chunk (token_overhead may be negative: a fitted correction of the
table's price per token, sim/step_fit.py), times the replica's slow-down factor; `attention` is 0 unless the
profile has an `attention` block, which prices the step's padded key positions beyond the table's own
(sim/attention.py); a request reaches its replica `request_path_s` after it arrives, or, when the profile
measured the path's way in (`request_path_in_s`), that long after it arrives, and its first token reaches the
client the rest of the path after the engine produced it.
A profile with a `host` block also shares its host's cores with the serving path, whose latency then
stretches with the host's contention (sim/host.py); one with a `step_noise` block has its steps' time
wander with its host's speed (sim/noise.py).
SPS(B) is the engine's own cost table class
(dspark.cost_table.CostTable: isotonic smoothing, linear interpolation) over the profile's points.
Acceptance is per position: `acceptance[domain][j-1]` is the probability that drafted token j is
accepted given tokens 1..j-1 were; confidences are taken as calibrated (equal to it).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from dspark.cost_table import CostTable
from sim.attention import AttentionCost
from sim.host import HostCost
from sim.noise import StepNoise

PROFILE_DIR = Path(__file__).parent / "profiles"


@dataclass(frozen=True)
class Profile:
    name: str
    sps_points: tuple[int, ...]
    sps_rates: tuple[float, ...]
    max_num_batched_tokens: int
    max_num_seqs: int
    kv_pages: int
    page_size: int
    gamma: int
    acceptance: Mapping[str, tuple[float, ...]]
    # The served engine's forward over the table's (sim/step_fit.py): the table still decides (verify
    # lengths, the draft gate), as the engine's own does, while the step is timed at this share of it.
    forward_scale: float = 1.0
    step_overhead_s: float = 0.0
    request_overhead_s: float = 0.0
    token_overhead_s: float = 0.0
    # The engine's work for each prompt chunk beyond its forward (handing its hidden states to the
    # drafter, offering its pages to the prefix cache, the first token's sampling): sim/step_fit.py.
    chunk_overhead_s: float = 0.0
    draft_s_per_step: float = 0.0
    draft_s_per_request: float = 0.0
    # The serving path: its latency to the first token beside the engine's work (proxy, ingress, router,
    # the stream's hops back), and the CPU it takes from the engines' host (None: its own CPUs).
    request_path_s: float = 0.0
    # Of it, the way in: arrival to the replica receiving the request (the router decides on the way,
    # the replica admits at its end); the rest is the first token's way back to the client. None: not
    # measured, the whole path is taken before the router sees the request.
    request_path_in_s: float | None = None
    host: HostCost | None = None
    # The engine's table heals from its observed forwards (dspark/cost_table.py), bucket by bucket: where
    # the served forwards part from the table (the table timed at start under other contention than
    # serving's), the draft gate and the verify lengths decide on the healed table, not the profiled one.
    # True: each replica heals a copy of the table from its modelled forwards' wall time, at the engine's
    # rate (`heal_rate`, EngineConfig.cost_table_ema), and its gate times drafting in wall time too.
    heal_table: bool = False
    heal_rate: float = 0.05
    # The table is the served forward's: the replicas' start-up profile reshaped to their engines' own
    # forward timers (bench/cost_profile.py, sim/step_fit.py reshape_rates). A validation against those
    # replicas keeps it rather than putting their start-up table from the engine's cache in its place
    # (bench/sim_validate.py, Profile.over_table).
    sps_served: bool = False
    # The engine's automatic prefix caching (EngineConfig.enable_prefix_caching): a request's leading
    # full prompt pages that an earlier prompt on its replica committed are reused, not prefilled
    # (dspark.kv_cache.PageManager), for requests whose trace carries their prompt's token ids.
    prefix_caching: bool = False
    # The machine's speed wander (sim/noise.py): each step's time multiplied by its host's wandering
    # speed. None: steps cost what the model prices, always.
    step_noise: StepNoise | None = None
    # A step's attention over its padded key positions beyond the table's (sim/attention.py). None: a
    # step is priced by its tokens alone, whatever its requests' contexts.
    attention: AttentionCost | None = None
    sources: tuple[str, ...] = ()
    assumptions: tuple[str, ...] = ()
    # Shared by every replica of this profile: the engine's table, and memoised verify-length choices.
    cache: dict = field(default_factory=dict, compare=False, repr=False, hash=False)

    def __post_init__(self) -> None:
        if self.forward_scale <= 0:  # a step always runs its forward (and the draft gate divides by it)
            raise ValueError(f"forward_scale must be positive, got {self.forward_scale}")
        if self.token_overhead_s < 0:  # a correction of the table's price per token (sim/step_fit.py)
            for b, rate in zip(self.sps_points, self.sps_rates):
                if self.forward_scale / rate + self.step_overhead_s + b * self.token_overhead_s <= 0:
                    raise ValueError(
                        f"token_overhead_s {self.token_overhead_s} makes a step of {b} tokens free"
                    )
        if self.attention is not None:  # the least padded step of B tokens: one request, no context
            for b, rate in zip(self.sps_points, self.sps_rates):
                if 1.0 / rate + self.attention.extra_s(b, b, b * b) <= 0:
                    raise ValueError(
                        f"attention's s_per_key {self.attention.s_per_key} makes a {b}-token forward free"
                    )
        for domain, row in self.acceptance.items():
            if len(row) < self.gamma or not all(0 <= c <= 1 for c in row):
                raise ValueError(f"acceptance[{domain!r}] needs {self.gamma} probabilities in [0, 1]")

    def cost_table(self) -> CostTable:
        if "table" not in self.cache:
            self.cache["table"] = CostTable(
                list(self.sps_points), list(self.sps_rates), self.max_num_batched_tokens, source="given"
            )
        return self.cache["table"]

    def forward_seconds(
        self, tokens: int, table: CostTable, padding: tuple[float, float] | None = None
    ) -> float:
        """The forward of a step of `tokens` whose attention is padded to `padding`, (keys, query-keys)
        (sim/attention.py; None: the table's own step's)."""
        if self.attention is None or padding is None:
            return self.forward_scale / table(tokens)
        return self.forward_scale * (1.0 / table(tokens) + self.attention.extra_s(tokens, *padding))

    def step_seconds(
        self,
        tokens: int,
        requests: int,
        drafting: int,
        table: CostTable,
        padding: tuple[float, float] | None = None,
        chunks: float = 0,
    ) -> float:
        seconds = self.forward_seconds(tokens, table, padding) + self.step_overhead_s
        seconds += requests * self.request_overhead_s + tokens * self.token_overhead_s
        seconds += chunks * self.chunk_overhead_s
        if drafting:
            seconds += self.draft_s_per_step + drafting * self.draft_s_per_request
        return seconds

    def scaled(self, speed: float, name: str | None = None) -> Profile:
        """The same replica `speed` times faster (e.g. a larger TP group): every rate scaled."""
        return replace(
            self,
            name=name or f"{self.name}x{speed:g}",
            sps_rates=tuple(r * speed for r in self.sps_rates),
            step_overhead_s=self.step_overhead_s / speed,
            request_overhead_s=self.request_overhead_s / speed,
            token_overhead_s=self.token_overhead_s / speed,
            chunk_overhead_s=self.chunk_overhead_s / speed,
            draft_s_per_step=self.draft_s_per_step / speed,
            draft_s_per_request=self.draft_s_per_request / speed,
            attention=None
            if self.attention is None
            else replace(
                self.attention,
                s_per_key=self.attention.s_per_key / speed,
                s_per_query_key=self.attention.s_per_query_key / speed,
            ),
            cache={},
        )

    def path_slowed(self, factor: float) -> Profile:
        """The serving path on a host `factor` times slower at CPU work: its latencies and its host block's
        CPU costs scaled (HostCost.slowed). The engine's steps slow by the replicas' own factor
        (Group.slow), which keeps the engine's table as profiled and heals it online toward the slower
        forwards, as a real engine on a machine that slowed after its table was timed does."""
        return replace(
            self,
            request_path_s=self.request_path_s * factor,
            request_path_in_s=None if self.request_path_in_s is None else self.request_path_in_s * factor,
            host=None if self.host is None else self.host.slowed(factor),
            cache={},
        )

    def over_table(self, points: Sequence[int], rates: Sequence[float]) -> Profile:
        """The profile over the served replicas' start-up SPS table (from the engine's cache), unless its
        own table is the served forward's already (`sps_served`): that one stays."""
        if self.sps_served:
            return self
        return replace(
            self,
            sps_points=tuple(points),
            sps_rates=tuple(rates),
            max_num_batched_tokens=max(self.max_num_batched_tokens, points[-1]),
            cache={},
        )

    def published_table(self) -> list[list[float]]:
        """The table as a replica publishes it for the router (deployments/replica_state.py)."""
        table = self.cost_table()
        return [[b, round(r, 3)] for b, r in zip(table.points, table.smoothed)]


def load(name_or_path: str | Path) -> Profile:
    """A profile by name (a file under sim/profiles/) or by path."""
    path = Path(name_or_path)
    if not path.suffix:
        path = PROFILE_DIR / f"{name_or_path}.json"
    return from_dict(json.loads(path.read_text()))


def from_dict(data: dict) -> Profile:
    """A profile from its file's contents."""
    return Profile(
        name=data["name"],
        sps_points=tuple(int(b) for b in data["sps"]["points"]),
        sps_rates=tuple(float(r) for r in data["sps"]["rates"]),
        max_num_batched_tokens=int(data["max_num_batched_tokens"]),
        max_num_seqs=int(data["max_num_seqs"]),
        kv_pages=int(data["kv_pages"]),
        page_size=int(data["page_size"]),
        gamma=int(data["gamma"]),
        acceptance={k: tuple(float(c) for c in v) for k, v in data["acceptance"].items()},
        forward_scale=float(data.get("forward_scale", 1.0)),
        step_overhead_s=float(data.get("step_overhead_s", 0.0)),
        request_overhead_s=float(data.get("request_overhead_s", 0.0)),
        token_overhead_s=float(data.get("token_overhead_s", 0.0)),
        chunk_overhead_s=float(data.get("chunk_overhead_s", 0.0)),
        draft_s_per_step=float(data.get("draft_s_per_step", 0.0)),
        draft_s_per_request=float(data.get("draft_s_per_request", 0.0)),
        request_path_s=float(data.get("request_path_s", 0.0)),
        request_path_in_s=None if data.get("request_path_in_s") is None else float(data["request_path_in_s"]),
        host=HostCost.from_json(data.get("host")),
        heal_table=bool(data.get("heal_table", False)),
        heal_rate=float(data.get("heal_rate", 0.05)),
        sps_served=bool(data.get("sps_served", False)),
        prefix_caching=bool(data.get("prefix_caching", False)),
        step_noise=StepNoise.from_json(data.get("step_noise")),
        attention=AttentionCost.from_json(data.get("attention")),
        sources=tuple(data.get("sources", ())),
        assumptions=tuple(data.get("assumptions", ())),
    )


def available() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.json"))
