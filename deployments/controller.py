"""Controller: the cluster controller (docs/ARCHITECTURE.md §3) as one Ray Serve deployment.

Every period it reads each target replica (`TargetReplica.controller_snapshot`, through Serve's
broadcast, which reaches every replica), lets the pure policy (controller/policy.py) decide each
replica's caps, and pushes the ones that changed, or that a replica does not hold (it restarted, a
push was lost), back by broadcast: each replica takes its own entry. Replicas keep their last caps
while the controller is down, and a restarted controller rebuilds its state from what they report,
starting from the budget each holds. Pooled rounds refit the STS temperatures when their calibration
drifts (controller/recalibration.py), pushed to every replica; a cost table the forwards drift from is
rescaled. With `otlp_port`, it also hosts an OTLP receiver: what the replicas export (TTFT/TPOT per
SLA class, calibration error, measured vs predicted forward time) is folded per period
(controller/otlp.py) over the broadcast snapshot. Each decision is a span event
`dspark.controller.decision` with its evidence and reason, and, with `record_path`, a line of the
controller's record (python -m controller.replay).

The admin surface (bearer token from `admin_tokens` required): state and decisions, pin or unpin a
replica's caps, pause. Served by the ingress over HTTP (deployments/controller_api.py) and gRPC
(deployments/controller_grpc.py, dspark.v1.ControllerAdmin).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections import deque
from dataclasses import asdict

from opentelemetry import trace
from ray import serve

from controller import record
from controller.decision import Caps, Decision
from controller.policy import Policy
from controller.recalibration import CalibrationPool, DriftWatch, ObservedRound, refit
from controller.telemetry import ReplicaTelemetry, from_routing_stats
from deployments.config import AppConfig
from deployments.controller_otlp import ExportedTelemetry
from deployments.errors import NotFoundError, UnauthorizedError
from deployments.telemetry import setup_process
from dspark.draft_budget import DraftBudget
from dspark.errors import InvalidRequestError

log = logging.getLogger(__name__)
REFIT_EVERY = 5  # periods between STS refit checks (a refit costs seconds of CPU, off the event loop)
FORGET_AFTER = 10  # periods without a reading before a replica is forgotten


@serve.deployment(
    name="Controller", num_replicas=1, max_ongoing_requests=32, ray_actor_options={"num_cpus": 0}
)
class Controller:
    async def __init__(self, replicas, config: dict) -> None:
        settings = AppConfig(**config).controller
        if settings is None:
            raise ValueError("controller: the app config enables no controller")
        self.settings = settings
        self.period_s = settings.period_s
        self.policy = Policy(settings.policy_config())
        self.replicas = replicas
        self.snapshots: dict[str, ReplicaTelemetry] = {}
        self.decisions: deque[Decision] = deque(maxlen=2000)
        self.pool = CalibrationPool()
        self.drift = DriftWatch()
        self.sts_in_force: dict[str, list[float]] = {}
        self.sts_by_replica: dict[str, dict[str, list[float]]] = {}  # what each replica reported holding
        self.refits: list[dict] = []
        self.errors = 0
        self.refusals: dict[tuple[str, str], dict] = {}  # (replica, push) -> {field, message}
        self.recorder = (
            record.Recorder(settings.record_path, self.policy.config) if settings.record_path else None
        )
        # This process's providers from the app's telemetry settings: decisions export as span events.
        self.telemetry = setup_process("controller")
        self._tracer = trace.get_tracer("dspark.controller")
        self.exported = (
            None
            if settings.otlp_port is None
            else ExportedTelemetry(settings.otlp_host, settings.otlp_port, settings.otlp_http_port)
        )
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            started = time.monotonic()
            try:
                await self.tick()
            except Exception:  # one bad period must not end the loop; replicas keep their caps
                self.errors += 1
                log.exception("controller period failed")
            await asyncio.sleep(max(0.0, self.period_s - (time.monotonic() - started)))

    async def tick(self) -> list[Decision]:
        """One period: read, decide, push."""
        readings = await self.replicas.broadcast("controller_snapshot").results_async(
            timeout_s=self.period_s, return_exceptions=True
        )
        now = time.time()
        for reading in readings:
            if isinstance(reading, dict):  # a replica that failed to answer ages toward stale
                self._take(reading, now)
        if self.exported is not None:  # before the record: replay sees what the policy saw
            self.exported.apply(self.snapshots)
        for rid in [r for r, s in self.snapshots.items() if now - s.taken_at > FORGET_AFTER * self.period_s]:
            del self.snapshots[rid]
            self.sts_by_replica.pop(rid, None)
            self.drift.forget(rid)
            if self.exported is not None:
                self.exported.forget(rid)
        if self.recorder is not None:
            self.recorder.write(record.period(now, self.snapshots.values()))
        decisions = self.policy.decide(self.snapshots, now)
        if not self.policy.paused:
            await self._push(decisions)  # before the events: a decision carries what its replica refused
        with self._tracer.start_as_current_span("dspark.controller.period") as span:
            for d in decisions:
                span.add_event("dspark.controller.decision", d.event_attributes())
                if self.recorder is not None:
                    self.recorder.write(record.decision(now, d))
        self.decisions.extend(decisions)
        if not self.policy.paused and self.settings.recalibrate:
            await self._recalibrate()
        return decisions

    def _take(self, reading: dict, now: float) -> None:
        snap = from_routing_stats(reading, taken_at=min(float(reading.get("ts", now)), now))
        if snap.replica_id not in self.snapshots and snap.replica_id not in self.policy.pins:
            self.policy.adopt(snap.replica_id, Caps.from_budget(snap.budget))  # rebuilt from the replica
        self.snapshots[snap.replica_id] = snap
        self.sts_by_replica[snap.replica_id] = reading.get("sts_temperatures") or {}
        self.sts_in_force = reading.get("sts_temperatures") or self.sts_in_force
        keys = [float(t) for t in self.sts_in_force]
        rounds = []
        for survival, accepted, temperature in reading.get("rounds_sample") or ():
            key = min(keys, key=lambda t: abs(t - temperature)) if keys else round(temperature, 2)
            rounds.append(ObservedRound(tuple(survival), int(accepted), key))
        self.pool.add(rounds)

    async def _push(self, decisions: list[Decision]) -> None:
        budgets = {
            d.replica_id: d.caps.budget()
            for d in decisions
            if d.replica_id in self.snapshots
            and _differs(self.snapshots[d.replica_id].budget, d.caps.budget())
        }
        if budgets:
            results = await self.replicas.broadcast("apply_caps", budgets).results_async(
                timeout_s=self.period_s, return_exceptions=True
            )
            self._note_refusals("apply_caps", results)
            by_replica = {d.replica_id: d for d in decisions}
            for result in results:  # caps a replica cannot apply (SGLang): named in its decision, by reason
                if (
                    isinstance(result, dict)
                    and result.get("refusals")
                    and result.get("replica_id") in by_replica
                ):
                    by_replica[result["replica_id"]].inputs["refused"] = {
                        r["field"]: r.get("reason", "refused") for r in result["refusals"]
                    }
        slowdowns = {}
        for rid, snap in self.snapshots.items():
            refresh = self.drift.observe(rid, snap.forward_slowdown)
            if refresh is not None:
                slowdowns[rid] = refresh.slowdown
        if slowdowns:
            results = await self.replicas.broadcast("rescale_cost_table", slowdowns).results_async(
                timeout_s=self.period_s, return_exceptions=True
            )
            self._note_refusals("rescale_cost_table", results)

    def _note_refusals(self, push: str, results: list) -> None:
        """A replica that cannot apply a push (SGLang: deployments/sglang_replica.py) says which field and
        why; it keeps what it holds. Logged once per reason, and shown in the admin state."""
        for result in results:
            if not isinstance(result, dict):
                continue
            key = (result.get("replica_id", "?"), push)
            refused = result.get("refusals") or ([result["refused"]] if result.get("refused") else [])
            if not refused:
                self.refusals.pop(key, None)
                continue
            why = {
                "field": ", ".join(r["field"] for r in refused),
                "message": "; ".join(r["message"] for r in refused),
            }
            why["reasons"] = {r["field"]: r.get("reason", "refused") for r in refused}
            if self.refusals.get(key) != why:
                log.warning("replica %s refused %s: %s", key[0], push, why["message"])
            self.refusals[key] = why

    async def _recalibrate(self) -> None:
        if self.policy.period % REFIT_EVERY:
            return
        window = max((s.window for s in self.snapshots.values()), default=0)
        for temperature in self.pool.temperatures():
            in_force = self.sts_in_force.get(str(temperature)) or [1.0] * window
            rounds = self.pool.rounds(temperature)
            result = await asyncio.to_thread(
                refit, rounds, in_force, self.settings.sts_threshold, self.settings.sts_min_rounds
            )
            if result is None:
                continue
            pushed = await self.replicas.broadcast(
                "set_sts_temperatures", {temperature: result.temperatures}
            ).results_async(timeout_s=self.period_s, return_exceptions=True)
            self._note_refusals("set_sts_temperatures", pushed)
            self.pool.clear(temperature)
            self.sts_in_force[str(temperature)] = result.temperatures
            self.refits.append({"period": self.policy.period, **asdict(result)})
            log.info(
                "STS refit at temperature %s: ECE %.3f -> %.3f",
                temperature,
                result.ece_before,
                result.ece_after,
            )

    # ---- admin (bearer token required) ----------------------------------------------------------------

    def _authorize(self, token: str | None) -> None:
        if not self.settings.admin_tokens:
            raise UnauthorizedError("the controller's admin surface is off: no admin_tokens configured")
        if not token or not any(hmac.compare_digest(token, t) for t in self.settings.admin_tokens):
            raise UnauthorizedError("missing or invalid bearer token")

    async def admin_state(self, token: str | None) -> dict:
        self._authorize(token)
        return {
            "period": self.policy.period,
            "period_s": self.period_s,
            "paused": self.policy.paused,
            "errors": self.errors,
            "pins": {rid: c.to_dict() for rid, c in self.policy.pins.items()},
            "replicas": {
                rid: {
                    "caps": self.policy.caps(rid).to_dict(),
                    "telemetry": s.to_dict(),
                    "sts_temperatures": self.sts_by_replica.get(rid, {}),
                }
                for rid, s in self.snapshots.items()
            },
            "sts_temperatures": self.sts_in_force,
            "refits": self.refits[-20:],
            "otlp": None if self.exported is None else self.exported.state(),
            "refusals": [{"replica_id": r, "push": p, **why} for (r, p), why in self.refusals.items()],
        }

    async def admin_decisions(self, token: str | None, limit: int = 100) -> list[dict]:
        self._authorize(token)
        return [d.to_dict() for d in list(self.decisions)[-max(0, int(limit)) :]]

    async def admin_pin(self, token: str | None, replica_id: str, caps: dict) -> dict:
        self._authorize(token)
        if replica_id not in self.snapshots:
            raise NotFoundError(f"no replica {replica_id!r}; known: {sorted(self.snapshots)}")
        unknown = sorted(set(caps) - set(Caps.__dataclass_fields__))
        if unknown:
            raise InvalidRequestError(
                f"caps.{unknown[0]}", f"unknown field; known: {sorted(Caps.__dataclass_fields__)}"
            )
        pinned = Caps.from_dict(caps)
        DraftBudget(**pinned.budget())  # refuses a negative or non-integer cap by name
        self.policy.pins[replica_id] = pinned
        self._admin("pin", replica_id, pinned.to_dict())
        return pinned.to_dict()

    async def admin_unpin(self, token: str | None, replica_id: str) -> bool:
        self._authorize(token)
        self._admin("unpin", replica_id)
        return self.policy.pins.pop(replica_id, None) is not None

    async def admin_pause(self, token: str | None, paused: bool) -> bool:
        self._authorize(token)
        self.policy.paused = bool(paused)
        self._admin("pause" if paused else "resume")
        return self.policy.paused

    def _admin(self, action: str, replica_id: str | None = None, caps: dict | None = None) -> None:
        if self.recorder is not None:
            self.recorder.write(record.admin(time.time(), action, replica_id, caps))

    def __del__(self) -> None:
        exported = getattr(self, "exported", None)
        if exported is not None:
            exported.close()

    def check_health(self) -> None:
        if self._task.done():
            raise RuntimeError(f"controller loop ended: {self._task.exception()!r}")


def _differs(in_force: dict, wanted: dict) -> bool:
    """Whether a replica's reported budget is not the one the controller wants it to hold."""
    fields = ("max_step_tokens", "max_request_tokens", "max_step_s")
    return any(in_force.get(f) != wanted.get(f) for f in fields) or dict(
        in_force.get("max_request_tokens_by_class") or {}
    ) != dict(wanted.get("max_request_tokens_by_class") or {})
