"""The cluster controller's policy: each replica's draft-budget caps, once per period (pure).

Division of labour (docs/ARCHITECTURE.md §3). The engine decides every step, per request, from live
confidences: whether to draft (the draft gate) and how many drafts to verify (Algorithm 1). The
controller decides every period (1–10 s), per replica, from what the replica *measured*: limits on
that choice. It never sets a verify length; its caps sit past the throughput optimum its model
predicts (controller/model.py), so a well-informed engine is rarely held back by them, and its inputs
(load, per-position acceptance, SPS drift, SLA attainment) do not depend on how many drafts the
engine chose inside the caps, so the two loops cannot drive each other round in circles. What only
the controller sees: the SLA classes (drafts of batch requests cut so interactive ones meet their
TPOT), acceptance that collapsed (drafting off, with probes to notice recovery), telemetry that went
stale (the engine's defaults), forwards slower than the table says, and how long a step may take
(`max_step_s`, Sarathi-Serve's principle: the prefill a step carries beside decoding requests is sized
from the tightest TPOT target among the classes running there; `_step_time` says how).

Stability (controller/stability.py): a dead band; one move per replica per period; a move goes only
as far as the last `confirm_windows` windows all ask for (two: one noisy window moves nothing, a step
is confirmed by the next window, a ramp is followed one window behind); a cap moves by at most half
its range per period. A clear load step therefore settles within three periods: one to confirm, at
most two to move. The safe moves, to the defaults on stale telemetry and drafting off on a collapse,
are taken at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from controller import model, stability
from controller.decision import DEFAULTS, Caps, Decision, Reason
from controller.telemetry import ReplicaTelemetry


@dataclass(frozen=True)
class SlaTarget:
    tpot_s: float  # time per output token the class must stay under
    interactive: bool = False  # interactive classes get priority over batch ones in the budget


@dataclass(frozen=True)
class PolicyConfig:
    period_s: float = 2.0
    stale_periods: float = 3.0  # telemetry older than this many periods: the engine's defaults
    slack: float = 0.02  # caps cut only drafts predicted to cost more than 2 % of the best throughput
    confirm_windows: int = 2  # windows whose targets must agree before a move (1: act on each window)
    limits: stability.Limits = field(default_factory=stability.Limits)
    min_evidence: int = 32  # verified drafts in the window before acceptance is believed
    collapse_acceptance: float = 0.1  # first-slot acceptance below this: drafting off
    probe_after: int = 5  # periods off before a probe; doubles while probes confirm the collapse
    max_probe_after: int = 80
    sla_classes: Mapping[str, SlaTarget] = field(default_factory=dict)
    sla_release_margin: float = 0.2  # priority lifted once interactive TPOT is 20 % under target
    step_time_limit: bool = True  # set max_step_s from the SLA classes' TPOT targets (off: prefill unbounded)

    def __post_init__(self) -> None:
        if not 1.0 <= self.period_s <= 10.0:
            raise ValueError(
                "period_s must be within 1-10 s (the controller's loop, docs/ARCHITECTURE.md §3)"
            )
        if self.confirm_windows < 1:
            raise ValueError("confirm_windows must be at least 1")


@dataclass
class _Memory:
    """What the controller carries between periods for one replica."""

    caps: Caps = DEFAULTS
    recent: list[Caps] = field(default_factory=list)  # the last windows' targets, oldest first
    collapse_streak: int = 0
    off_periods: int = 0  # periods since drafting went off (collapse)
    probe_after: int = 0
    probing: bool = False
    before_off: Caps = DEFAULTS


class Policy:
    def __init__(self, config: PolicyConfig | None = None) -> None:
        self.config = config or PolicyConfig()
        self.period = 0
        self.paused = False
        self.pins: dict[str, Caps] = {}
        self._memory: dict[str, _Memory] = {}

    def caps(self, replica_id: str) -> Caps:
        return self._memory.get(replica_id, _Memory()).caps

    def adopt(self, replica_id: str, caps: Caps) -> None:
        """Start from the caps a replica already holds (a restarted controller rebuilds its state)."""
        self._memory[replica_id] = _Memory(caps=caps, probe_after=self.config.probe_after)

    def decide(self, snapshots: Mapping[str, ReplicaTelemetry], now: float) -> list[Decision]:
        """One period: one decision per replica the controller has ever had a snapshot of."""
        self.period += 1
        for gone in set(self._memory) - set(snapshots):
            del self._memory[gone]  # the replica left the deployment
        return [self._decide(rid, snap, now) for rid, snap in sorted(snapshots.items())]

    def _decide(self, rid: str, snap: ReplicaTelemetry, now: float) -> Decision:
        mem = self._memory.setdefault(rid, _Memory(probe_after=self.config.probe_after))
        before = mem.caps
        inputs = _inputs(snap, now)
        if self.paused:
            mem.recent = []
            return Decision(rid, self.period, before, before, Reason.PAUSED, inputs)
        if rid in self.pins:
            mem.caps, mem.recent = self.pins[rid], []
            return Decision(rid, self.period, mem.caps, before, Reason.PINNED, inputs)
        if now - snap.taken_at > self.config.stale_periods * self.config.period_s:
            self._memory[rid] = _Memory(probe_after=self.config.probe_after)
            return Decision(rid, self.period, DEFAULTS, before, Reason.STALE, inputs)
        if not snap.healthy:
            mem.recent = []
            return Decision(rid, self.period, before, before, Reason.UNHEALTHY, inputs)

        off = self._drafting_off(mem, snap, inputs)
        if off is not None:
            mem.recent = []
            return Decision(rid, self.period, mem.caps, before, off, inputs)
        if len(snap.acceptance) < 1 or snap.verified_drafts < self.config.min_evidence or not snap.sps_table:
            mem.recent = []  # a window without evidence breaks the run of agreeing windows
            return Decision(rid, self.period, before, before, Reason.NO_EVIDENCE, inputs)

        target, reason = self._target(snap, mem.caps, inputs)
        most = max(snap.load, 1) * snap.window
        limits = self.config.limits
        mem.recent = [*mem.recent, target][-self.config.confirm_windows :]
        if target == mem.caps or stability.within_dead_band(target, mem.caps, most, snap.window, limits):
            steady = Reason.STEADY if target == mem.caps else Reason.DEAD_BAND
            return Decision(rid, self.period, before, before, steady, inputs)
        goal = stability.agreed(mem.caps, mem.recent, most, snap.window)
        if len(mem.recent) < self.config.confirm_windows or stability.within_dead_band(
            goal, mem.caps, most, snap.window, limits
        ):  # seen in too few windows, or the windows disagree: act when the next ones agree
            return Decision(rid, self.period, before, before, Reason.UNCONFIRMED, inputs)
        mem.caps, limited = stability.toward(mem.caps, goal, most, snap.window, limits)
        return Decision(rid, self.period, mem.caps, before, reason, inputs, rate_limited=limited)

    # ---- drafting off and probes -------------------------------------------------------------------

    def _drafting_off(self, mem: _Memory, snap: ReplicaTelemetry, inputs: dict) -> Reason | None:
        """Switch drafting off on a collapse, keep it off until a probe, probe; None: drafting stays on."""
        cfg = self.config
        if not mem.caps.drafting:
            mem.off_periods += 1
            if mem.off_periods < mem.probe_after:
                return Reason.DRAFTING_OFF
            mem.caps, mem.probing = mem.before_off, True
            return Reason.PROBE
        evident = bool(snap.acceptance) and snap.verified_drafts >= cfg.min_evidence
        if not evident:
            return None
        if snap.acceptance[0] >= cfg.collapse_acceptance:
            mem.collapse_streak = 0
            if mem.probing:  # the probe found drafting pays again
                mem.probing, mem.probe_after = False, cfg.probe_after
            return None
        mem.collapse_streak += 1
        inputs["collapse_streak"] = mem.collapse_streak
        if mem.collapse_streak < (1 if mem.probing else cfg.confirm_windows):
            return None
        if mem.probing:  # the probe confirmed the collapse: wait longer before the next one
            mem.probe_after = min(2 * mem.probe_after, cfg.max_probe_after)
        mem.before_off, mem.probing = mem.caps, False
        mem.caps = mem.caps.but(drafting=False)
        mem.collapse_streak, mem.off_periods = 0, 0
        return Reason.COLLAPSE

    # ---- the target --------------------------------------------------------------------------------

    def _target(self, snap: ReplicaTelemetry, current: Caps, inputs: dict) -> tuple[Caps, Reason]:
        window = snap.window
        acceptance = list(snap.acceptance[:window]) + [snap.acceptance[-1]] * (window - len(snap.acceptance))
        sps = model.SpsCurve.of(snap.sps_table, snap.forward_slowdown)
        plan = model.plan_step(snap.load, acceptance, sps, self.config.slack)
        # An adaptive engine (Algorithm 1) is capped past the optimum and chooses inside; one with fixed
        # windows spreads the step cap evenly over its requests (trim_longest), so for it the cap is the
        # optimum itself. A per-request cap would only stop an adaptive engine from giving confident
        # requests more drafts than the average one: it is left to SLA classes and operators.
        most = max(snap.load, 1) * window
        chosen = plan.cap_drafts if snap.adaptive else plan.best_drafts
        step_cap = None if chosen >= most else chosen
        inputs.update(
            best_drafts=plan.best_drafts,
            cap_drafts=plan.cap_drafts,
            cap_depth=round(plan.cap_depth, 4),
            predicted_throughput=round(plan.best_throughput, 3),
            plain_throughput=round(plan.plain_throughput, 3),
        )
        target = Caps(step_cap)
        cur_total = most if current.max_step_tokens is None else current.max_step_tokens
        new_total = most if step_cap is None else step_cap
        reason = Reason.SHRINK if step_cap is not None and new_total < cur_total else Reason.GROW

        sla = self._sla(snap, current, acceptance, sps, plan, window)
        if sla is not None:
            by_class, on = sla
            if on != current.interactive_priority or by_class != dict(current.by_class):
                reason = Reason.SLA_PRIORITY if on else Reason.SLA_RELEASE
            target = target.but(by_class=by_class, interactive_priority=on)
        step_s = self._step_time(snap, acceptance)
        inputs["max_step_s"] = step_s
        if step_s != current.max_step_s and target == current.but(max_step_s=None):
            reason = Reason.STEP_TIME  # nothing but the step-time limit moves
        return target.but(max_step_s=step_s), reason

    def _step_time(self, snap: ReplicaTelemetry, acceptance: list[float]) -> float | None:
        """How long a step may take: the tightest TPOT target among the classes running there, times
        the tokens a round gives a request that verifies one draft (1 + α_1, the measured first-slot
        acceptance). TPOT is per output token and a round emits 1 + accepted tokens, so a step of
        tpot·(1 + α_1) keeps such a request at its target in expectation; requests verifying more
        drafts gain more per round and stay further inside. Not the full τ: a step that long would
        let the prefill take the whole target from a request whose drafts fail, and the step's
        decoding tokens would be priced as if every request accepted its mean. None: no class with a
        target runs there, or the limit is off (the engine's token budget alone)."""
        targets = self.config.sla_classes
        running = [targets[c].tpot_s for c, s in snap.classes.items() if c in targets and s.running > 0]
        if not self.config.step_time_limit or not running:
            return None
        return round(min(running) * (1.0 + acceptance[0]), 4)

    def _sla(
        self,
        snap: ReplicaTelemetry,
        current: Caps,
        acceptance: list[float],
        sps: model.SpsCurve,
        plan: model.StepPlan,
        req: int,
    ) -> tuple[dict[str, int], bool] | None:
        """Per-class caps when an interactive class misses its TPOT while batch requests run beside it.

        Batch requests get the most drafts per round that still let the interactive ones meet their
        target, predicted by the model and corrected by how far the measured TPOT sits from the
        model's prediction under the caps in force; a class with a TPOT target of its own is never cut
        below the drafts that target needs (predicted and corrected the same way)."""
        targets = self.config.sla_classes
        interactive = {c: s for c, s in snap.classes.items() if c in targets and targets[c].interactive}
        batch = {c: s for c, s in snap.classes.items() if c not in interactive and s.running > 0}
        measured = {c: s.tpot_s for c, s in interactive.items() if s.tpot_s is not None and s.running > 0}
        if not measured or not batch:
            return None if not current.interactive_priority else ({}, False)
        tight = min(measured, key=lambda c: targets[c].tpot_s)
        goal = targets[tight].tpot_s
        missed = measured[tight] > goal
        if current.interactive_priority and measured[tight] < goal * (1 - self.config.sla_release_margin):
            return {}, False
        if not missed and not current.interactive_priority:
            return None
        n_int = sum(s.running for s in interactive.values())
        n_batch = sum(s.running for s in batch.values())
        step_cap = plan.num_requests * snap.window if plan.unconstrained else plan.cap_drafts
        load = max(snap.load, n_int + n_batch)

        def tpot(own: int, batch_cap: int) -> float:
            """TPOT of a request verifying `own` drafts while the batch classes verify `batch_cap`."""
            drafts = min(step_cap, n_int * req + n_batch * batch_cap)
            return 1.0 / model.per_user_rate(load, own, acceptance, load + drafts, sps)

        in_force = min(current.by_class.get(next(iter(batch)), req), req)
        correction = measured[tight] / tpot(req, in_force)
        batch_cap = 0
        for cap in range(req, -1, -1):
            if correction * tpot(req, cap) <= goal:
                batch_cap = cap
                break
        by_class = {c: snap.window for c in interactive}
        for c, stats in batch.items():
            # A class with a TPOT target of its own yields drafts only down to what that target needs:
            # cut further, it misses its own SLA (and if even no drafts at all cannot bring the
            # interactive class under its goal, the cut would cost this class without saving that one).
            floor = 0
            if c in targets:
                own_cap = min(current.by_class.get(c, req), req)
                own = stats.tpot_s / tpot(own_cap, own_cap) if stats.tpot_s is not None else 1.0
                floor = next((k for k in range(req + 1) if own * tpot(k, k) <= targets[c].tpot_s), req)
            by_class[c] = max(batch_cap, floor)
        return by_class, True


def _inputs(snap: ReplicaTelemetry, now: float) -> dict:
    return {
        "age_s": round(now - snap.taken_at, 3),
        "load": snap.load,
        "running": snap.running,
        "queued": snap.queued,
        "acceptance_1": round(snap.acceptance[0], 4) if snap.acceptance else None,
        "verified_drafts": snap.verified_drafts,
        "verify_tokens_per_step": round(snap.verify_tokens_per_step, 3),
        "forward_slowdown": round(snap.forward_slowdown, 4),
        "calibration_error": snap.calibration_error,
        "tpot_s": {c: s.tpot_s for c, s in snap.classes.items() if s.tpot_s is not None},
    }
