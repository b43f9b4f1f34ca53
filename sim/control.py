"""The controller arm: controller/'s pure policy as the simulated cluster's budget loop.

Every period it reads each replica's telemetry as the real controller would receive it (load, measured
acceptance by position over the window, drafts verified, the SPS table, TTFT/TPOT per SLA class of the
requests finished in the window, the budget in force) into controller.telemetry.ReplicaTelemetry, calls
controller.policy.Policy.decide, and applies each decision's caps as the replica's DraftBudget (what
TargetReplica.set_draft_budget does). controller/ is imported when the arm is built, so the simulator
runs without it for the other arms.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

import numpy as np

from dspark.draft_budget import DraftBudget
from dspark.verify_policy import SCHEDULED_MODES
from router.policy import Sla
from sim.replica import SimReplica
from sim.workload import Request


class ControllerArm:
    def __init__(self, classes: Mapping[str, Sla], period_s: float = 2.0) -> None:
        from controller.policy import Policy, PolicyConfig, SlaTarget

        targets = {name: SlaTarget(s.tpot_s, interactive=s.priority == 0) for name, s in classes.items()}
        self.policy = Policy(PolicyConfig(period_s=period_s, sla_classes=targets))
        self.period_s = period_s
        self._last: dict[str, tuple[int, int, Counter]] = {}
        self.reasons: Counter = Counter()
        self.changes = 0

    def __call__(
        self, now: float, replicas: list[SimReplica], finished: Mapping[str, list[Request]]
    ) -> dict[str, DraftBudget]:
        snapshots = {r.replica_id: self._telemetry(r, now, finished.get(r.replica_id, [])) for r in replicas}
        budgets = {}
        for decision in self.policy.decide(snapshots, now):
            self.reasons[decision.reason.value] += 1
            self.changes += decision.changed
            budgets[decision.replica_id] = DraftBudget(**decision.caps.budget())
        return budgets

    def _telemetry(self, r: SimReplica, now: float, finished: list[Request]):
        from controller.telemetry import ClassStats, ReplicaTelemetry

        c = r.counters
        steps, drafted, before = self._last.get(r.replica_id, (0, 0, Counter()))
        self._last[r.replica_id] = (c.steps, c.drafted_tokens, Counter(c.verify_accept))
        acceptance = acceptance_by_position(c.verify_accept - before, r.gamma)
        running = Counter(s.req.sla_class for s in r.seqs.values())
        classes = {}
        for name in sorted(set(running) | {q.sla_class for q in finished}):
            mine = [q for q in finished if q.sla_class == name]
            classes[name] = ClassStats(
                running=running.get(name, 0),
                ttft_s=float(np.percentile([q.ttft for q in mine], 90)) if mine else None,
                tpot_s=float(np.percentile([q.tpot for q in mine], 90)) if mine else None,
            )
        d_steps = c.steps - steps
        return ReplicaTelemetry(
            replica_id=r.replica_id,
            taken_at=now,
            running=sum(1 for s in r.seqs.values() if s.decoding),
            queued=sum(1 for s in r.seqs.values() if not s.decoding),
            max_num_seqs=r.profile.max_num_seqs,
            window=r.gamma,
            sps_table=tuple((int(b), float(v)) for b, v in r.published_table),
            acceptance=tuple(acceptance),
            verified_drafts=c.drafted_tokens - drafted,
            verify_tokens_per_step=(c.drafted_tokens - drafted) / d_steps if d_steps else 0.0,
            forward_slowdown=1.0,  # the published table already heals to the replica's speed
            classes=classes,
            budget=r.budget.to_dict(),
            adaptive=r.scheduler in SCHEDULED_MODES,
            healthy=r.alive,
        )


def acceptance_by_position(rounds: Counter, window: int) -> tuple[float, ...]:
    """alpha_j = P(slot j accepted | slot j verified, slots < j accepted), from rounds counted by
    (verified, accepted); positions without evidence end the tuple."""
    out = []
    for j in range(1, window + 1):
        reached = sum(k for (n, a), k in rounds.items() if n >= j and a >= j - 1)
        if reached == 0:
            break
        out.append(sum(k for (n, a), k in rounds.items() if n >= j and a >= j) / reached)
    return tuple(out)
