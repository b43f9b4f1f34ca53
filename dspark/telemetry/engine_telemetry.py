"""A replica's telemetry around its engine: a span and metrics per request, sampled step events.

The engine knows nothing of OpenTelemetry: it hands out RequestOutputs (with timestamps and
speculation counters) and, to its step observers, a StepReport per step. This class turns those into
spans and metrics. Per step it does O(1) work unless the step is sampled; then it adds one
`dspark.step` event to the span of every request the step served. Counters and gauges are read from
the engine when the SDK collects (dspark/telemetry/metrics.py).

Threads: `on_step` runs on the engine thread; requests start and finish on the replica's event loop.
They share only `_live` (engine request id -> span), a dict whose single operations are atomic.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from opentelemetry.trace import Span, SpanKind

from dspark.outputs import RequestOutput, StepReport
from dspark.sampling_params import SamplingParams
from dspark.telemetry import semconv as sc
from dspark.telemetry.attributes import (
    Attributes,
    error_type,
    metric_attributes,
    request_timings,
    round_attributes,
    speculation_attributes,
    step_attributes,
)
from dspark.telemetry.metrics import EngineMetrics
from dspark.telemetry.sampling import StepSampler
from dspark.telemetry.setup import Telemetry
from dspark.telemetry.spans import RequestSpan


class EngineTelemetry:
    def __init__(self, telemetry: Telemetry, engine, model: str, replica_id: str) -> None:
        self.telemetry, self.engine, self.model, self.replica_id = telemetry, engine, model, replica_id
        self.metrics = (
            EngineMetrics(telemetry.meter, engine, model, replica_id) if telemetry.metering else None
        )
        self.sampler = StepSampler(telemetry.settings.step_sample_rate)
        self._live: dict[str, Span] = {}
        if telemetry.tracing or telemetry.metering:  # otherwise the engine runs with no observer at all
            engine.step_observers.append(self.on_step)

    def attach(self, engine) -> None:
        """Follow a new engine of the same replica (rebuilt for another Serve rank): its steps, its
        counters. The instruments stay (a meter keeps the first callbacks registered under a name)."""
        self.engine = engine
        if self.metrics is not None:
            self.metrics.attach(engine)
        if self.telemetry.tracing or self.telemetry.metering:
            engine.step_observers.append(self.on_step)

    def on_step(self, report: StepReport) -> None:
        """Engine thread, after every step."""
        if self.metrics is not None:
            self.metrics.record_step(report)
        if not self._live or not self.sampler.sample():
            return
        common = step_attributes(report)
        for round_ in report.rounds:
            if (span := self._live.get(round_.request_id)) is not None:
                span.add_event(sc.STEP_EVENT, {**common, **round_attributes(round_)})
        for request_id in report.prefill_request_ids:
            if (span := self._live.get(request_id)) is not None:
                span.add_event(sc.STEP_EVENT, common)

    def start(
        self,
        engine_id: str,
        label: str,
        operation: str,
        params: SamplingParams,
        carrier: Mapping[str, str] | None = None,
    ) -> RequestTrace:
        """A request arrived (event loop); `carrier` holds the ingress span's context."""
        return RequestTrace(self, engine_id, label, operation, params, carrier)


class RequestTrace:
    """One request on the replica: its span (a child of the ingress span) and its metrics."""

    def __init__(
        self,
        owner: EngineTelemetry,
        engine_id: str,
        label: str,
        operation: str,
        params: SamplingParams,
        carrier: Mapping[str, str] | None,
    ) -> None:
        self.owner, self.engine_id, self.params = owner, engine_id, params
        self.arrival = time.monotonic()
        self.metric_attrs = metric_attributes(operation, owner.model, params.sla_class)
        self.span = RequestSpan(owner.telemetry.tracer, operation, owner.model, carrier, SpanKind.INTERNAL)
        if self.span.recording:
            self.span.set_request(params, **{sc.REQUEST_ID: label, sc.REPLICA_ID: owner.replica_id})
            owner._live[engine_id] = self.span.span

    def finished(self, out: RequestOutput) -> Attributes | None:
        """The engine's last output: metrics recorded, span filled; returns the speculation attributes
        for the ingress span (None when this request is not traced)."""
        engine = self.owner.engine
        timings = request_timings(self.arrival, out.metrics, len(out.token_ids))
        # An abort is the client leaving: its duration says nothing about the server, so it is skipped.
        if self.owner.metrics is not None and out.finish_reason != "abort":
            error = error_type(out.error) if out.error is not None else None
            self.owner.metrics.record_request(self.metric_attrs, timings, error)
        if not self.span.recording:
            self.close()
            return None
        attrs = speculation_attributes(
            out.speculation,
            drafter=engine.drafter.name,
            block_length=engine.gamma,
            budget=engine.draft_budget,
            sla_class=self.params.sla_class,
            timings=timings,
        )
        self.span.finish(out.finish_reason, len(out.prompt_token_ids), len(out.token_ids), attrs)
        self.close()
        return attrs

    def failed(self, exc: BaseException, server_fault: bool = True) -> None:
        """The request failed before its last output (refused, engine error, shutdown)."""
        if self.owner.metrics is not None:
            duration = time.monotonic() - self.arrival
            self.owner.metrics.duration.record(
                duration, {**self.metric_attrs, sc.ERROR_TYPE: error_type(exc)}
            )
        self.span.fail(exc, server_fault)
        self.close()

    def close(self) -> None:
        """Ends the span if nothing else did (the client left) and stops step events for it."""
        self.owner._live.pop(self.engine_id, None)
        self.span.end()
