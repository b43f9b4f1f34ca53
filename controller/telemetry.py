"""What the controller knows about one replica at one moment: a plain snapshot, and how it is read from
a replica's routing stats (deployments/replica_state.py).

A snapshot holds the load, the acceptance by position, the drafts verified per step, the cost table
and how much slower the forwards measured than the table predicts, TTFT/TPOT per SLA class, the
calibration error of the drafter's confidences, the budget in force, and when it was taken.
Snapshots are also the controller's record format (controller/record.py), so `to_dict` and
`from_dict` round-trip exactly.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

from controller.model import fit_geometric_acceptance


@dataclass(frozen=True)
class ClassStats:
    """One SLA class on one replica over the last window."""

    running: int = 0
    ttft_s: float | None = None  # recent time to first token (a high percentile), seconds
    tpot_s: float | None = None  # recent time per output token after the first, seconds


@dataclass(frozen=True)
class ReplicaTelemetry:
    replica_id: str
    taken_at: float  # seconds, on the controller's clock
    running: int
    queued: int
    max_num_seqs: int
    window: int  # the drafter's window γ: the most drafts per request per round
    sps_table: tuple[tuple[int, float], ...] = ()  # [(batch tokens, verify steps/s)], as profiled
    acceptance: tuple[float, ...] = ()  # α_k: acceptance of slot k given slots < k were accepted
    verified_drafts: int = 0  # drafted tokens verified in the window: the evidence behind `acceptance`
    verify_tokens_per_step: float = 0.0
    forward_slowdown: float = 1.0  # measured forward seconds / the table's prediction
    classes: Mapping[str, ClassStats] = field(default_factory=dict)
    calibration_error: float | None = None
    budget: Mapping = field(default_factory=dict)  # the DraftBudget in force, as a dict
    adaptive: bool = True  # the engine chooses verify lengths itself (Algorithm 1), within the caps
    healthy: bool = True

    @property
    def load(self) -> int:
        """Requests the next steps decode: the running ones plus the queue, up to the engine's limit."""
        return min(self.running + self.queued, self.max_num_seqs)

    def to_dict(self) -> dict:
        out = asdict(self)
        out["sps_table"] = [list(p) for p in self.sps_table]
        out["acceptance"] = list(self.acceptance)
        return out

    @classmethod
    def from_dict(cls, data: Mapping) -> ReplicaTelemetry:
        data = dict(data)
        data["sps_table"] = tuple((int(b), float(r)) for b, r in data.get("sps_table") or ())
        data["acceptance"] = tuple(float(a) for a in data.get("acceptance") or ())
        data["classes"] = {k: ClassStats(**v) for k, v in (data.get("classes") or {}).items()}
        data["budget"] = dict(data.get("budget") or {})
        return cls(**data)


def from_routing_stats(
    stats: Mapping, taken_at: float, rounds_in_window: int | None = None
) -> ReplicaTelemetry:
    """A snapshot from a replica's stats: `TargetReplica.controller_snapshot` (its routing stats plus the
    controller's own window: acceptance by position, rounds and drafts verified), or routing stats
    alone, which carry only τ and the drafts verified per round: acceptance is then the geometric law
    that explains them (as the router reads them). `rounds_in_window` sizes that evidence.
    """
    window = int(stats.get("draft_window") or stats.get("num_speculative_tokens") or 0)
    tau, mean_verified = float(stats.get("recent_tau", 0.0)), float(stats.get("mean_verified", 0.0))
    rounds = rounds_in_window if rounds_in_window is not None else int(stats.get("window_rounds", 0))
    measured = tuple(float(a) for a in stats.get("acceptance_by_position") or ())
    if measured:  # the replica's own tap (deployments/replica_control.py): acceptance slot by slot
        acceptance, verified = measured, int(stats.get("window_verified", 0))
        mean_verified = verified / rounds if rounds else 0.0
    else:  # routing stats alone: the geometric law that explains their tau
        alpha = fit_geometric_acceptance(tau, mean_verified)
        acceptance = () if alpha is None else (alpha,) * window
        verified = int(round(mean_verified * rounds))
    running = int(stats.get("running_requests", 0))
    tpot = stats.get("tpot_by_class") or {}
    classes = {
        name or "default": ClassStats(running=int(n), tpot_s=tpot.get(name))
        for name, n in (stats.get("running_by_class") or {}).items()
    }
    return ReplicaTelemetry(
        replica_id=str(stats.get("replica_id", "?")),
        taken_at=taken_at,
        running=running,
        queued=int(stats.get("queued_requests", 0)),
        max_num_seqs=int(stats.get("max_num_seqs", max(1, running))),
        window=window,
        sps_table=tuple((int(b), float(r)) for b, r in stats.get("sps_table") or ()),
        acceptance=acceptance,
        verified_drafts=verified,
        verify_tokens_per_step=mean_verified * running,
        forward_slowdown=float(stats.get("forward_slowdown", 1.0)),
        classes=classes,
        calibration_error=stats.get("calibration_error"),
        budget=dict(stats.get("draft_budget") or {}),
        adaptive=bool(stats.get("adaptive_verify", True)),
        healthy=bool(stats.get("healthy", True)),
    )
