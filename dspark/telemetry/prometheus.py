"""A Prometheus scrape endpoint for a process's OpenTelemetry metrics, with vLLM-style names.

The SDK's PrometheusMetricReader turns instruments into Prometheus families (`gen_ai.server.
time_to_first_token`, unit s -> `gen_ai_server_time_to_first_token_seconds`). Our own namespace is
then written the way vLLM writes its own (`vllm:spec_decode_num_drafts_total`): `dspark_...` becomes
`dspark:...`, so the spec-decode counters read `dspark:spec_decode_num_drafts_total`, and a vLLM
dashboard works by swapping the prefix. OpenTelemetry instrument names cannot hold a colon, hence
the renaming at the exposition only.

Why our own endpoint and not Ray's metrics agent: the agent re-creates every metric as an
OpenTelemetry instrument named `ray_<name>`, where no colon can go, so vLLM-compatible names cannot
pass through it. Each replica process serves its own registry instead; replicas sharing a node take
the first free port from the configured one upward.
"""

from __future__ import annotations

import logging

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.exporter.prometheus._mapping import map_unit, sanitize_full_name
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.metrics_core import Metric

from dspark.telemetry.metrics import Instrument

log = logging.getLogger(__name__)

OTEL_PREFIX, PROMETHEUS_PREFIX = "dspark_", "dspark:"
PORT_SPAN = 32  # ports tried from the configured one: replicas (and TP ranks) sharing a node


def prometheus_name(name: str) -> str:
    """A family name as exposed: our namespace written `dspark:` (vLLM style), every other unchanged."""
    return PROMETHEUS_PREFIX + name[len(OTEL_PREFIX) :] if name.startswith(OTEL_PREFIX) else name


def prometheus_family(instrument: Instrument) -> str:
    """The family an instrument becomes: the exporter's own sanitising and unit suffix, then our prefix."""
    name, unit = sanitize_full_name(instrument.name), map_unit(instrument.unit)
    if unit and not name.endswith("_" + unit):
        name += "_" + unit
    return prometheus_name(name)


def prometheus_series(instrument: Instrument) -> tuple[str, ...]:
    """The sample names a scrape shows for an instrument (what dashboards query)."""
    family = prometheus_family(instrument)
    if instrument.kind == "counter":
        return (family + "_total",)
    if instrument.kind == "histogram":
        return (family + "_bucket", family + "_sum", family + "_count")
    return (family,)


class _Namespaced:
    """A prometheus_client collector: the families of `inner`, our namespace renamed."""

    def __init__(self, inner: CollectorRegistry) -> None:
        self.inner = inner

    def collect(self):
        for family in self.inner.collect():
            name = prometheus_name(family.name)
            if name == family.name:
                yield family
                continue
            renamed = Metric(name, family.documentation, family.type, family.unit)
            renamed.samples = [s._replace(name=name + s.name[len(family.name) :]) for s in family.samples]
            yield renamed


class PrometheusEndpoint:
    """A metric reader for the MeterProvider plus the HTTP server that exposes it (GET /metrics)."""

    def __init__(self, port: int, addr: str = "0.0.0.0", span: int = PORT_SPAN) -> None:
        registry = CollectorRegistry(auto_describe=False)
        # Scope labels (otel_scope_*) off: series carry the labels vLLM's do, nothing more.
        self.reader = PrometheusMetricReader(registry=registry, scope_info_enabled=False)
        exposed = CollectorRegistry(auto_describe=False)
        exposed.register(_Namespaced(registry))
        for candidate in range(port, min(port + span, 65536)):
            try:
                self._server, self._thread = start_http_server(candidate, addr, registry=exposed)
            except OSError:  # taken, most likely by another replica on this node
                continue
            self.port = candidate
            log.info("Prometheus metrics on http://%s:%d/metrics", addr, candidate)
            return
        raise OSError(f"no free port for the Prometheus endpoint in [{port}, {port + span})")

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
