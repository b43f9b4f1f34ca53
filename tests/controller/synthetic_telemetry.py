"""Synthetic telemetry for the controller's tests: a replica whose load, acceptance and timings we set.

The cost table has the shape real ones have: flat while the hardware has headroom, falling once the
forward saturates it (tokens per second of one verify step, 1 ... 2048 batch tokens).
"""

from __future__ import annotations

from controller.telemetry import ClassStats, ReplicaTelemetry

TABLE = ((1, 60.0), (64, 59.0), (128, 56.0), (256, 45.0), (512, 28.0), (1024, 15.0), (2048, 8.0))
WINDOW = 7


def snap(
    load: int,
    t: float,
    alpha: float = 0.8,
    replica_id: str = "r0",
    verified: int = 10_000,
    slowdown: float = 1.0,
    classes: dict[str, ClassStats] | None = None,
    taken_at: float | None = None,
    max_num_seqs: int = 512,
    adaptive: bool = True,
) -> ReplicaTelemetry:
    return ReplicaTelemetry(
        replica_id=replica_id,
        taken_at=t if taken_at is None else taken_at,
        running=load,
        queued=0,
        max_num_seqs=max_num_seqs,
        window=WINDOW,
        sps_table=TABLE,
        acceptance=(alpha,) * WINDOW,
        verified_drafts=verified,
        verify_tokens_per_step=0.0,
        forward_slowdown=slowdown,
        classes=classes or {},
        adaptive=adaptive,
    )
