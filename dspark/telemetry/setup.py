"""Tracer and meter providers for one serving process, from the standard environment.

    telemetry = setup_telemetry("replica", {"service.instance.id": replica_id, ...})

What is exported, and how, follows dspark/telemetry/settings.py; the SDK itself reads the rest of
the OTEL_* variables (sampler, service name and resource attributes, export interval, batch limits,
headers and TLS). With nothing configured the process gets no-op tracer and meter and no providers.

The providers become the process's global ones when no SDK provider is set yet, so other code in the
process (a drafter plugin, a library's instrumentation) traces into the same pipeline. When one is
already set, typically by Ray Serve's own tracing (RAY_SERVE_TRACING_EXPORTER_IMPORT_PATH), ours stay
private rather than fight over the global (OpenTelemetry allows one per process): the kit's spans go
to our exporters either way, because it uses the tracer from here, never the global one.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, replace

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter

from dspark.telemetry import semconv as sc
from dspark.telemetry.prometheus import PrometheusEndpoint
from dspark.telemetry.settings import SignalSettings, TelemetrySettings

log = logging.getLogger(__name__)

SCOPE = "dspark"  # instrumentation scope of every span and instrument the kit creates
DEFAULT_SERVICE_NAME = "dspark"


@dataclass
class Telemetry:
    """One process's telemetry: a tracer and a meter (no-ops when nothing is exported) and what backs them."""

    settings: TelemetrySettings
    tracer: trace.Tracer
    meter: metrics.Meter
    tracer_provider: TracerProvider | None = None
    meter_provider: MeterProvider | None = None
    prometheus: PrometheusEndpoint | None = None

    @property
    def tracing(self) -> bool:
        return self.tracer_provider is not None

    @property
    def metering(self) -> bool:
        return self.meter_provider is not None

    def flush(self, timeout_ms: int = 5000) -> None:
        if self.tracer_provider is not None:
            self.tracer_provider.force_flush(timeout_ms)
        if self.meter_provider is not None:
            self.meter_provider.force_flush(timeout_ms)

    def shutdown(self) -> None:
        """Export what is pending and stop (the providers also do this at interpreter exit)."""
        if self.tracer_provider is not None:
            self.tracer_provider.shutdown()
        if self.meter_provider is not None:
            self.meter_provider.shutdown()
        if self.prometheus is not None:
            self.prometheus.close()


def setup_telemetry(
    role: str,
    identity: Mapping[str, str | int] | None = None,
    *,
    span_exporter: SpanExporter | None = None,
    metric_reader: MetricReader | None = None,
    set_global: bool = True,
    prometheus: bool = True,
) -> Telemetry:
    """Providers for a process in `role` ("ingress", "replica"), from os.environ.

    `identity`: resource attributes naming this process (service.instance.id, dspark.replica.id, the
    node, ...). `span_exporter` / `metric_reader` add an exporter of the caller's (tests: in-memory)
    and turn that signal on whatever the environment says. `prometheus`: whether this process serves
    the scrape endpoint when DSPARK_PROMETHEUS_PORT is set (processes without metrics of their own don't).
    """
    settings = TelemetrySettings.from_env(os.environ)
    if not prometheus:
        settings = replace(settings, prometheus_port=None)
    tracing = settings.tracing or span_exporter is not None
    metering = settings.metering or metric_reader is not None
    if not (tracing or metering):
        return Telemetry(settings, trace.NoOpTracer(), metrics.NoOpMeter(SCOPE))
    resource = process_resource(role, identity or {})
    telemetry = Telemetry(settings, trace.NoOpTracer(), metrics.NoOpMeter(SCOPE))
    if tracing:
        provider = TracerProvider(resource=resource)  # the sampler comes from OTEL_TRACES_SAMPLER(_ARG)
        if settings.tracing:
            provider.add_span_processor(BatchSpanProcessor(_span_exporter(settings.traces)))
        if span_exporter is not None:
            provider.add_span_processor(SimpleSpanProcessor(span_exporter))
        telemetry.tracer_provider, telemetry.tracer = provider, provider.get_tracer(SCOPE)
        if set_global:
            _set_global_tracer_provider(provider)
    if metering:
        readers: list[MetricReader] = []
        if settings.metrics.enabled and not settings.disabled:
            # The export interval comes from OTEL_METRIC_EXPORT_INTERVAL.
            readers.append(PeriodicExportingMetricReader(_metric_exporter(settings.metrics)))
        if settings.prometheus_port is not None and not settings.disabled:
            telemetry.prometheus = PrometheusEndpoint(settings.prometheus_port)
            readers.append(telemetry.prometheus.reader)
        if metric_reader is not None:
            readers.append(metric_reader)
        provider = MeterProvider(metric_readers=readers, resource=resource)
        telemetry.meter_provider, telemetry.meter = provider, provider.get_meter(SCOPE)
        if set_global:
            _set_global_meter_provider(provider)
    return telemetry


def process_resource(role: str, identity: Mapping[str, str | int]) -> Resource:
    """Who exports: the service, this process's role and identity, the host and the pid.

    OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME are merged in by the SDK; the service is named
    "dspark" only when neither names it.
    """
    attrs: dict[str, str | int] = {
        sc.ROLE: role,
        "host.name": socket.gethostname(),
        "process.pid": os.getpid(),
        **identity,
    }
    if not _service_named(os.environ):
        attrs["service.name"] = DEFAULT_SERVICE_NAME
    return Resource.create(attrs)


def _service_named(env: Mapping[str, str]) -> bool:
    if env.get("OTEL_SERVICE_NAME", "").strip():
        return True
    pairs = env.get("OTEL_RESOURCE_ATTRIBUTES", "").split(",")
    return any(pair.split("=", 1)[0].strip() == "service.name" for pair in pairs)


def _span_exporter(signal: SignalSettings) -> SpanExporter:
    """The exporter reads its endpoint, headers, TLS and timeout from OTEL_EXPORTER_OTLP_* itself."""
    if signal.exporter == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if signal.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    return OTLPSpanExporter()


def _metric_exporter(signal: SignalSettings):
    if signal.exporter == "console":
        from opentelemetry.sdk.metrics.export import ConsoleMetricExporter

        return ConsoleMetricExporter()
    if signal.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
    else:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    return OTLPMetricExporter()


def _set_global_tracer_provider(provider: TracerProvider) -> None:
    if isinstance(trace.get_tracer_provider(), TracerProvider):
        log.info(
            "a tracer provider is already set in this process (Ray Serve's tracing?); ours stays private"
        )
        return
    trace.set_tracer_provider(provider)


def _set_global_meter_provider(provider: MeterProvider) -> None:
    if isinstance(metrics.get_meter_provider(), MeterProvider):
        log.info("a meter provider is already set in this process; ours stays private")
        return
    metrics.set_meter_provider(provider)
