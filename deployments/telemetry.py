"""Telemetry of the Serve processes: the app config's `telemetry:` block and each process's setup.

Every serving process configures itself from its environment, the standard OTEL_* variables
(dspark/telemetry/settings.py). Those reach Ray's worker processes in three ways, later ones winning:
the environment Ray itself was started in (`OTEL_EXPORTER_OTLP_ENDPOINT=... make serve`), an
application's `runtime_env.env_vars` in a Serve config (what the Helm chart renders), and this
block, which build_app lowers to the `env_vars` of each deployment's runtime_env.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from dspark.telemetry import semconv as sc
from dspark.telemetry.settings import PROMETHEUS_PORT_ENV, STEP_SAMPLE_RATE_ENV, TelemetrySettings
from dspark.telemetry.setup import Telemetry, setup_telemetry

# The samplers the SDK knows by name (OTEL_TRACES_SAMPLER).
Sampler = Literal[
    "always_on",
    "always_off",
    "traceidratio",
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
]


class TelemetryConfig(BaseModel):
    """OpenTelemetry settings for every process of the app; unset fields leave the environment's."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    otlp_endpoint: str | None = Field(
        None, description="OTEL_EXPORTER_OTLP_ENDPOINT, e.g. http://collector:4317"
    )
    otlp_protocol: Literal["grpc", "http/protobuf"] | None = Field(
        None, description="OTEL_EXPORTER_OTLP_PROTOCOL"
    )
    service_name: str | None = Field(None, description="OTEL_SERVICE_NAME (default dspark)")
    traces_sampler: Sampler | None = Field(None, description="OTEL_TRACES_SAMPLER")
    traces_sampler_arg: float | None = Field(None, ge=0, le=1, description="OTEL_TRACES_SAMPLER_ARG")
    metric_export_interval_ms: int | None = Field(None, gt=0, description="OTEL_METRIC_EXPORT_INTERVAL")
    step_sample_rate: float | None = Field(
        None, ge=0, le=1, description=f"{STEP_SAMPLE_RATE_ENV}: share of engine steps recorded as span events"
    )
    prometheus_port: int | None = Field(
        None, gt=0, lt=65536, description=f"{PROMETHEUS_PORT_ENV}: first port of the replicas' /metrics"
    )
    # Any other OTEL_* variable, verbatim: headers, certificates, timeouts, span limits, ...
    env: dict[str, str] = Field(default_factory=dict)

    @field_validator("env")
    @classmethod
    def _otel_only(cls, value: dict[str, str]) -> dict[str, str]:
        if bad := sorted(k for k in value if not k.startswith("OTEL_")):
            raise ValueError(f"{bad[0]!r}: only OTEL_* variables go here")
        return value

    def env_vars(self) -> dict[str, str]:
        """The block as environment variables for the deployments' runtime_env."""
        named = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": self.otlp_endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": self.otlp_protocol,
            "OTEL_SERVICE_NAME": self.service_name,
            "OTEL_TRACES_SAMPLER": self.traces_sampler,
            "OTEL_TRACES_SAMPLER_ARG": self.traces_sampler_arg,
            "OTEL_METRIC_EXPORT_INTERVAL": self.metric_export_interval_ms,
            STEP_SAMPLE_RATE_ENV: self.step_sample_rate,
            PROMETHEUS_PORT_ENV: self.prometheus_port,
        }
        return {**self.env, **{k: str(v) for k, v in named.items() if v is not None}}


def describe(env: Mapping[str, str], block: TelemetryConfig) -> str:
    """What an app's processes will export, given the environment Ray starts in and the app's block
    (which wins): the line `make serve` prints. A bad value raises ValueError naming its variable."""
    settings = TelemetrySettings.from_env({**env, **block.env_vars()})
    if settings.disabled:
        return "telemetry off (OTEL_SDK_DISABLED=true)"
    parts = []
    if settings.tracing:
        where = settings.traces.endpoint or "the console"
        parts.append(
            f"traces to {where} ({settings.traces.protocol}), engine steps as span events on "
            f"{settings.step_sample_rate:.0%} of steps"
        )
    if settings.metrics.enabled:
        parts.append(f"metrics to {settings.metrics.endpoint or 'the console'} ({settings.metrics.protocol})")
    if settings.prometheus_port is not None:
        parts.append(f"Prometheus /metrics on each target replica from port {settings.prometheus_port}")
    if not parts:
        return "telemetry off: set OTEL_EXPORTER_OTLP_ENDPOINT (e.g. http://localhost:4317) to export it"
    return "telemetry: " + "; ".join(parts)


def process_identity() -> dict[str, str]:
    """Resource attributes naming this Serve replica (ingress or target) and its Ray node."""
    import ray
    from ray import serve

    identity: dict[str, str] = {}
    try:
        context = serve.get_replica_context()
    except Exception:  # outside Serve: a test constructing a deployment class directly
        return identity
    identity |= {
        "service.instance.id": context.replica_id.unique_id,
        sc.REPLICA_ID: context.replica_id.unique_id,
        sc.DEPLOYMENT: context.deployment,
        sc.APP: context.app_name,
    }
    if ray.is_initialized():
        identity[sc.NODE_ID] = ray.get_runtime_context().get_node_id()
    return identity


def setup_process(role: str, prometheus: bool = False) -> Telemetry:
    """This process's providers, named after its Serve replica; `prometheus`: serve the scrape endpoint
    (the target replicas, whose metrics it exposes)."""
    return setup_telemetry(role, process_identity(), prometheus=prometheus)
