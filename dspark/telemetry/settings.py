"""What a serving process exports, read from the standard OpenTelemetry environment (pure).

The SDK reads most OTEL_* variables itself (service name, resource attributes, sampler, export
interval, headers, TLS); this module decides only what the SDK leaves to whoever builds providers by
hand: whether anything is exported at all, and over which protocol. OTEL_EXPORTER_OTLP_PROTOCOL is
read by the SDK's auto-configuration only, so it is read here.

Nothing is exported unless an endpoint is set: without one a process gets no-op providers and the
engine gets no observers, so telemetry costs nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

log = logging.getLogger(__name__)

PROTOCOLS = ("grpc", "http/protobuf")
EXPORTERS = ("otlp", "console", "none")
# Ours, beside the standard variables: the share of engine steps recorded as span events on the
# requests they served, and the port of the Prometheus scrape endpoint (unset: none).
STEP_SAMPLE_RATE_ENV = "DSPARK_TRACE_STEP_SAMPLE_RATE"
PROMETHEUS_PORT_ENV = "DSPARK_PROMETHEUS_PORT"
DEFAULT_STEP_SAMPLE_RATE = 0.05


@dataclass(frozen=True)
class SignalSettings:
    """How one signal (traces or metrics) leaves the process."""

    exporter: str  # "otlp" | "console" | "none"
    endpoint: str | None  # OTLP endpoint, signal-specific or the common one
    protocol: str  # "grpc" | "http/protobuf"

    @property
    def enabled(self) -> bool:
        return self.exporter == "console" or (self.exporter == "otlp" and bool(self.endpoint))


@dataclass(frozen=True)
class TelemetrySettings:
    traces: SignalSettings
    metrics: SignalSettings
    step_sample_rate: float = DEFAULT_STEP_SAMPLE_RATE
    prometheus_port: int | None = None
    disabled: bool = False  # OTEL_SDK_DISABLED

    @property
    def tracing(self) -> bool:
        return not self.disabled and self.traces.enabled

    @property
    def metering(self) -> bool:
        """Metrics are kept when they go anywhere: an OTLP endpoint, the console, or Prometheus."""
        return not self.disabled and (self.metrics.enabled or self.prometheus_port is not None)

    @staticmethod
    def from_env(env: Mapping[str, str]) -> TelemetrySettings:
        """Settings from OTEL_* (and DSPARK_*) variables; a bad value raises ValueError naming it."""
        return TelemetrySettings(
            traces=_signal(env, "TRACES"),
            metrics=_signal(env, "METRICS"),
            step_sample_rate=_rate(env),
            prometheus_port=_port(env),
            disabled=env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true",
        )


def _signal(env: Mapping[str, str], signal: str) -> SignalSettings:
    exporter_var = f"OTEL_{signal}_EXPORTER"
    exporter = env.get(exporter_var, "otlp").strip().lower() or "otlp"
    if exporter not in EXPORTERS:
        raise ValueError(f"{exporter_var}: {exporter!r} is not one of {', '.join(EXPORTERS)}")
    endpoint = _first(env, f"OTEL_EXPORTER_OTLP_{signal}_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
    protocol_var = (
        f"OTEL_EXPORTER_OTLP_{signal}_PROTOCOL"
        if env.get(f"OTEL_EXPORTER_OTLP_{signal}_PROTOCOL", "").strip()
        else "OTEL_EXPORTER_OTLP_PROTOCOL"
    )
    # grpc, as the Python SDK's own auto-configuration defaults to (port 4317).
    protocol = env.get(protocol_var, "").strip().lower() or "grpc"
    if protocol not in PROTOCOLS:
        raise ValueError(f"{protocol_var}: {protocol!r} is not one of {', '.join(PROTOCOLS)}")
    if exporter == "otlp" and endpoint and protocol == "grpc" and not _insecure_set(env, signal):
        if urlsplit(endpoint).scheme not in ("http", "https"):
            # The gRPC exporter's rule: no scheme means TLS. Against a plaintext collector that fails
            # on every export with WRONG_VERSION_NUMBER, so say so once, here.
            log.warning(
                "OTLP gRPC endpoint %r has no scheme: the exporter will use TLS; write http://%s "
                "for a plaintext collector (or set OTEL_EXPORTER_OTLP_INSECURE=true)",
                endpoint,
                endpoint,
            )
    return SignalSettings(exporter, endpoint, protocol)


def _first(env: Mapping[str, str], *names: str) -> str | None:
    for name in names:
        if value := env.get(name, "").strip():
            return value
    return None


def _insecure_set(env: Mapping[str, str], signal: str) -> bool:
    value = _first(env, f"OTEL_EXPORTER_OTLP_{signal}_INSECURE", "OTEL_EXPORTER_OTLP_INSECURE")
    return value is not None and value.lower() == "true"


def _rate(env: Mapping[str, str]) -> float:
    raw = env.get(STEP_SAMPLE_RATE_ENV, "").strip()
    if not raw:
        return DEFAULT_STEP_SAMPLE_RATE
    try:
        rate = float(raw)
    except ValueError:
        rate = float("nan")
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"{STEP_SAMPLE_RATE_ENV}: must be a number in [0, 1], got {raw!r}")
    return rate


def _port(env: Mapping[str, str]) -> int | None:
    raw = env.get(PROMETHEUS_PORT_ENV, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        raise ValueError(f"{PROMETHEUS_PORT_ENV}: must be a port in [1, 65535], got {raw!r}")
    return int(raw)
