"""What the controller decides for one replica each period: caps, and the reason with its evidence.

Caps are the engine's draft budget (dspark/draft_budget.py) as the controller sets it: limits on
drafted tokens verified per step, per request, per request of an SLA class; drafting off is a step
cap of 0 (plain decoding); `max_step_s` limits a step's predicted time, which bounds the prefill it
carries beside decoding requests (dspark/step_budget.py). `None` means no limit beyond the engine's
own, so `Caps()` is the engine's default, where the controller falls back when it cannot see a replica.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace


class Reason(str, enum.Enum):
    STEADY = "steady"  # the target is what is in force
    DEAD_BAND = "dead_band"  # the target differs by too little to act on
    UNCONFIRMED = "awaiting_confirmation"  # a new target, seen in one window only
    NO_EVIDENCE = "no_evidence"  # too few verified drafts to judge acceptance: keep what is in force
    SHRINK = "load_up_shrink"  # a smaller budget at this load (heavier load: fewer drafts per request pay)
    GROW = "load_down_grow"  # a larger budget at this load (lighter load, or caps set for a lighter one)
    SLA_PRIORITY = "sla_interactive_priority"  # batch requests' drafts cut so interactive ones meet TPOT
    SLA_RELEASE = "sla_priority_release"  # interactive TPOT met with margin: batch caps lifted
    STEP_TIME = "sla_step_time"  # the step-time limit follows the tightest TPOT target running there
    COLLAPSE = "acceptance_collapse"  # rolling acceptance collapsed: drafting off
    DRAFTING_OFF = "drafting_off_hold"  # off, waiting for the next probe
    PROBE = "probe_drafting"  # drafting back on to measure acceptance again
    STALE = "stale_telemetry_defaults"  # telemetry older than the limit: the engine's defaults
    UNHEALTHY = "unhealthy_hold"  # the replica reports itself unhealthy: leave it alone
    PINNED = "pinned"  # an operator pinned the caps
    PAUSED = "paused"  # the controller is paused: nothing pushed


@dataclass(frozen=True)
class Caps:
    max_step_tokens: int | None = None
    max_request_tokens: int | None = None
    by_class: Mapping[str, int] = field(default_factory=dict)
    drafting: bool = True
    interactive_priority: bool = False  # by_class favours interactive classes over batch ones
    max_step_s: float | None = None  # from the tightest TPOT target running there (Policy._step_time)

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_class", dict(sorted(self.by_class.items())))

    def __hash__(self) -> int:
        return hash(
            (
                self.max_step_tokens,
                self.max_request_tokens,
                tuple(self.by_class.items()),
                self.drafting,
                self.max_step_s,
            )
        )

    def budget(self) -> dict:
        """The DraftBudget fields (TargetReplica.set_draft_budget) these caps amount to."""
        return {
            "max_step_tokens": 0 if not self.drafting else self.max_step_tokens,
            "max_request_tokens": self.max_request_tokens,
            "max_request_tokens_by_class": dict(self.by_class),
            "max_step_s": self.max_step_s,
        }

    def to_dict(self) -> dict:
        return {
            "max_step_tokens": self.max_step_tokens,
            "max_request_tokens": self.max_request_tokens,
            "by_class": dict(self.by_class),
            "drafting": self.drafting,
            "interactive_priority": self.interactive_priority,
            "max_step_s": self.max_step_s,
        }

    @classmethod
    def from_dict(cls, data: Mapping) -> Caps:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})

    @classmethod
    def from_budget(cls, budget: Mapping) -> Caps:
        """The caps a replica's reported DraftBudget amounts to (a step cap of 0: drafting off)."""
        step = budget.get("max_step_tokens")
        return cls(
            None if step == 0 else step,
            budget.get("max_request_tokens"),
            dict(budget.get("max_request_tokens_by_class") or {}),
            drafting=step != 0,
            max_step_s=budget.get("max_step_s"),
        )

    def but(self, **changes) -> Caps:
        return replace(self, **changes)


DEFAULTS = Caps()


@dataclass(frozen=True)
class Decision:
    replica_id: str
    period: int
    caps: Caps  # in force after this decision
    previous: Caps
    reason: Reason
    inputs: Mapping = field(default_factory=dict)  # the evidence: load, acceptance, plan, SLA, age
    rate_limited: bool = False  # the move toward the target was cut short by the rate limit

    @property
    def changed(self) -> bool:
        return self.caps != self.previous

    def to_dict(self) -> dict:
        return {
            "replica_id": self.replica_id,
            "period": self.period,
            "reason": self.reason.value,
            "changed": self.changed,
            "rate_limited": self.rate_limited,
            "caps": self.caps.to_dict(),
            "previous": self.previous.to_dict(),
            "inputs": dict(self.inputs),
        }

    def event_attributes(self) -> dict:
        """Flat attributes for the span event `dspark.controller.decision` (OpenTelemetry types only)."""
        attrs = {
            "dspark.replica.id": self.replica_id,
            "dspark.controller.period": self.period,
            "dspark.controller.reason": self.reason.value,
            "dspark.controller.changed": self.changed,
            "dspark.controller.rate_limited": self.rate_limited,
            "dspark.controller.caps": json.dumps(self.caps.to_dict(), sort_keys=True),
        }
        for key, value in self.inputs.items():
            if isinstance(value, (bool, int, float, str)):
                attrs[f"dspark.controller.input.{key}"] = value
            elif value is not None:
                attrs[f"dspark.controller.input.{key}"] = json.dumps(value, sort_keys=True)
        return attrs
