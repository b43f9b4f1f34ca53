"""What the replicas' OpenTelemetry export tells the controller, folded per replica and per period (pure).

The controller hosts an OTLP receiver (deployments/controller.py); the replicas, or a Collector fanning
out to a tracing backend and to it, export spans and metrics there. Each period the received spans
and points are folded here into one `Measured` per replica, which `merge` lays over the snapshot read
by broadcast (controller/telemetry.py):

- TTFT and TPOT per SLA class: a high percentile of the replica's request spans of the period
  (`dspark.time_to_first_token` / `dspark.time_per_output_token`, `dspark.sla_class`); without spans
  (sampled out), the mean of the period from the GenAI latency histograms (cumulative: the difference
  of successive points);
- the calibration error of the drafter's confidences: the latest `dspark.confidence.calibration_error`;
- `forward_slowdown`: the sampled engine steps' measured forward seconds over the cost table's
  prediction (`dspark.step` events), summed over the period, each step counted once.

Points and spans are duck-typed (dspark.telemetry.receiver's ReceivedPoint and ReceivedSpan): only
their fields are read. A replica is named by `dspark.replica.id` (resource or attribute); only
processes whose resource says `dspark.role = replica` are read, so ingress spans never count.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from controller.telemetry import ClassStats, ReplicaTelemetry
from dspark.telemetry import semconv as sc

# The names the replicas export under (dspark/telemetry/semconv.py; plain strings, no SDK import).
REPLICA_ID, ROLE, SLA_CLASS = sc.REPLICA_ID, sc.ROLE, sc.SLA_CLASS
SPAN_TTFT, SPAN_TPOT = sc.TIME_TO_FIRST_TOKEN, sc.TIME_PER_OUTPUT_TOKEN
STEP_EVENT, STEP_INDEX = sc.STEP_EVENT, sc.STEP_INDEX
STEP_PREDICTED, STEP_MEASURED = sc.STEP_PREDICTED_FORWARD, sc.STEP_MEASURED_FORWARD
METRIC_TTFT, METRIC_TPOT = sc.TTFT, sc.TPOT
METRIC_CALIBRATION = "dspark.confidence.calibration_error"  # dspark/telemetry/metrics.py; a test checks it
DEFAULT_CLASS = "default"  # dspark/telemetry/attributes.py DEFAULT_SLA_CLASS


@dataclass(frozen=True)
class Measured:
    """One replica's period, as its export told it."""

    ttft_s: Mapping[str, float] = field(default_factory=dict)  # per SLA class
    tpot_s: Mapping[str, float] = field(default_factory=dict)
    calibration_error: float | None = None
    forward_slowdown: float | None = None
    steps: int = 0  # sampled steps behind forward_slowdown
    requests: int = 0  # request spans behind the percentiles


class OtlpFold:
    """Spans and points in, one `Measured` per replica out at the end of each period."""

    def __init__(self, percentile: float = 0.9) -> None:
        if not 0 < percentile <= 1:
            raise ValueError(f"percentile must be in (0, 1], got {percentile!r}")
        self.percentile = percentile
        self._latency: dict[tuple[str, str, str], list[float]] = {}  # (replica, ttft|tpot, class)
        self._steps: dict[str, dict[int, tuple[float, float]]] = {}  # replica -> index -> (meas., pred.)
        self._requests: dict[str, int] = {}
        self._calibration: dict[str, float] = {}
        # Cumulative histograms: the latest (count, sum) per series, and where the period started.
        self._hist: dict[tuple[str, str, str], tuple[int, float]] = {}
        self._hist_mark: dict[tuple[str, str, str], tuple[int, float]] = {}

    def add_spans(self, spans: Iterable) -> None:
        for span in spans:
            if span.resource.get(ROLE) != "replica":
                continue
            rid = span.resource.get(REPLICA_ID) or span.attributes.get(REPLICA_ID)
            if rid is None:
                continue
            rid = str(rid)
            cls = str(span.attributes.get(SLA_CLASS) or DEFAULT_CLASS)
            counted = False
            for key, name in (("ttft", SPAN_TTFT), ("tpot", SPAN_TPOT)):
                value = span.attributes.get(name)
                if _finite(value):
                    self._latency.setdefault((rid, key, cls), []).append(float(value))
                    counted = True
            self._requests[rid] = self._requests.get(rid, 0) + counted
            steps = self._steps.setdefault(rid, {})
            for name, _, attrs in span.events:
                if name != STEP_EVENT:
                    continue
                measured, predicted = attrs.get(STEP_MEASURED), attrs.get(STEP_PREDICTED)
                if _finite(measured) and _finite(predicted) and predicted > 0:
                    # A step leaves one event on every request it served: count it once.
                    steps[int(attrs.get(STEP_INDEX, -1 - len(steps)))] = (float(measured), float(predicted))

    def add_points(self, points: Iterable) -> None:
        for point in points:
            if point.resource.get(ROLE) not in (None, "replica"):
                continue
            rid = point.attributes.get(REPLICA_ID) or point.resource.get(REPLICA_ID)
            if rid is None:
                continue
            rid = str(rid)
            if point.metric == METRIC_CALIBRATION and _finite(point.value):
                self._calibration[rid] = float(point.value)
            elif point.metric in (METRIC_TTFT, METRIC_TPOT) and point.count is not None:
                key = "ttft" if point.metric == METRIC_TTFT else "tpot"
                series = (rid, key, str(point.attributes.get(SLA_CLASS) or DEFAULT_CLASS))
                if point.count < self._hist.get(series, (0, 0.0))[0]:
                    self._hist_mark[series] = (0, 0.0)  # the replica's process restarted: counts anew
                self._hist[series] = (int(point.count), float(point.total or 0.0))

    def window(self) -> dict[str, Measured]:
        """The period that ends now, per replica heard from; the next period starts empty."""
        replicas = {k[0] for k in self._latency} | set(self._steps) | set(self._calibration)
        replicas |= {k[0] for k in self._hist}
        out = {}
        for rid in replicas:
            ttft, tpot = self._latencies(rid, "ttft"), self._latencies(rid, "tpot")
            steps = self._steps.get(rid, {}).values()
            predicted = sum(p for _, p in steps)
            out[rid] = Measured(
                ttft_s=ttft,
                tpot_s=tpot,
                calibration_error=self._calibration.get(rid),
                forward_slowdown=sum(m for m, _ in steps) / predicted if predicted > 0 else None,
                steps=len(steps),
                requests=self._requests.get(rid, 0),
            )
        self._latency.clear()
        self._steps.clear()
        self._requests.clear()
        self._hist_mark = dict(self._hist)
        return out

    def _latencies(self, rid: str, key: str) -> dict[str, float]:
        spans = {c: v for (r, k, c), v in self._latency.items() if r == rid and k == key and v}
        out = {c: _quantile(v, self.percentile) for c, v in spans.items()}
        for (r, k, c), (count, total) in self._hist.items():
            if r != rid or k != key or c in out:
                continue
            count0, total0 = self._hist_mark.get((r, k, c), (0, 0.0))
            if count > count0:
                out[c] = (total - total0) / (count - count0)
        return out

    def forget(self, replica_id: str) -> None:
        """A replica gone for good: its series would otherwise be kept forever."""
        for store in (self._hist, self._hist_mark):
            for key in [k for k in store if k[0] == replica_id]:
                del store[key]
        self._calibration.pop(replica_id, None)


def merge(snap: ReplicaTelemetry, measured: Measured | None) -> ReplicaTelemetry:
    """The broadcast snapshot with what the export measured laid over it (the export wins where it has a
    value; the running counts per class stay the snapshot's)."""
    if measured is None:
        return snap
    classes = dict(snap.classes)
    for cls in set(measured.ttft_s) | set(measured.tpot_s):
        base = classes.get(cls, ClassStats())
        classes[cls] = replace(
            base,
            ttft_s=measured.ttft_s.get(cls, base.ttft_s),
            tpot_s=measured.tpot_s.get(cls, base.tpot_s),
        )
    return replace(
        snap,
        classes=classes,
        calibration_error=snap.calibration_error
        if measured.calibration_error is None
        else measured.calibration_error,
        forward_slowdown=snap.forward_slowdown
        if measured.forward_slowdown is None
        else measured.forward_slowdown,
    )


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _quantile(values: list[float], q: float) -> float:
    """The nearest-rank quantile (the value at rank ceil(q·n))."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]
