"""SLA classes: configured by name in the app config, chosen per request.

A request names its class with the gRPC `sla_class` field, the HTTP body's `sla_class`, or the header
`x-sla-class` (the field wins); none: the app's `default_sla_class`. llm-d's headers `x-slo-ttft-ms` and
`x-slo-tpot-ms` (HTTP headers or gRPC metadata) set ad-hoc targets on top of the class, which still
gives the priority, whether it may be shed, and its name (the engine's per-class draft budget).
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field

from dspark.errors import InvalidRequestError
from router.policy import Sla

CLASS_HEADER = "x-sla-class"
TTFT_HEADER = "x-slo-ttft-ms"
TPOT_HEADER = "x-slo-tpot-ms"
MAX_TARGET_MS = 86_400_000.0  # a day: anything longer is no latency target


class SlaClass(BaseModel):
    """One class in the app config: its targets, how it ranks against others, whether it may be shed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ttft_ms: float = Field(gt=0, le=MAX_TARGET_MS, description="time to first token target")
    tpot_ms: float = Field(gt=0, le=MAX_TARGET_MS, description="time per output token target")
    priority: int = Field(0, ge=0, description="lower is more important")
    may_shed: bool = Field(False, description="refuse with 429 when no replica can meet the targets")

    def sla(self, name: str) -> Sla:
        return Sla(name, self.ttft_ms / 1e3, self.tpot_ms / 1e3, self.priority, self.may_shed)


DEFAULT_CLASSES: dict[str, SlaClass] = {
    "interactive": SlaClass(ttft_ms=1000, tpot_ms=100, priority=0, may_shed=True),
    "standard": SlaClass(ttft_ms=5000, tpot_ms=250, priority=1, may_shed=False),
    "batch": SlaClass(ttft_ms=60000, tpot_ms=2000, priority=2, may_shed=False),
}
DEFAULT_CLASS = "standard"


def classes_of(config: Mapping[str, SlaClass]) -> dict[str, Sla]:
    return {name: c.sla(name) for name, c in config.items()}


def resolve(classes: Mapping[str, Sla], default: str, field: str | None, headers: Mapping[str, str]) -> Sla:
    """The request's SLA from its `sla_class` field, else its headers, else the default class."""
    name = field or headers.get(CLASS_HEADER) or default
    base = classes.get(name)
    if base is None:
        shown = ascii(name) if len(name) <= 40 else f"a name of {len(name)} characters"
        raise InvalidRequestError("sla_class", f"unknown class {shown}; configured: {sorted(classes)}")
    ttft = _target_s(headers, TTFT_HEADER)
    tpot = _target_s(headers, TPOT_HEADER)
    if ttft is None and tpot is None:
        return base
    return Sla(base.name, ttft or base.ttft_s, tpot or base.tpot_s, base.priority, base.may_shed)


def _target_s(headers: Mapping[str, str], name: str) -> float | None:
    raw = headers.get(name)
    if raw is None:
        return None
    try:
        ms = float(raw)
    except ValueError:
        ms = float("nan")
    if not 0 < ms <= MAX_TARGET_MS:  # also refuses NaN
        shown = ascii(raw) if len(raw) <= 40 else f"a value of {len(raw)} characters"
        raise InvalidRequestError(name, f"must be milliseconds in (0, {MAX_TARGET_MS:g}], got {shown}")
    return ms / 1e3
