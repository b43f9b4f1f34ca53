"""The app config's `telemetry:` block: validated once, lowered to OTEL_* variables of every deployment."""

from __future__ import annotations

import pydantic
import pytest

from deployments.app import STREAMING_ENV, build_app
from deployments.config import AppConfig
from deployments.telemetry import TelemetryConfig, describe


def test_the_block_as_environment_variables():
    block = TelemetryConfig(
        otlp_endpoint="http://collector:4317",
        otlp_protocol="http/protobuf",
        service_name="dspark-prod",
        traces_sampler="parentbased_traceidratio",
        traces_sampler_arg=0.05,
        metric_export_interval_ms=15000,
        step_sample_rate=0.1,
        prometheus_port=9464,
        env={"OTEL_EXPORTER_OTLP_HEADERS": "x-token=abc", "OTEL_SERVICE_NAME": "overridden"},
    )
    assert block.env_vars() == {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_SERVICE_NAME": "dspark-prod",  # the named field wins over the same variable in `env`
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "0.05",
        "OTEL_METRIC_EXPORT_INTERVAL": "15000",
        "DSPARK_TRACE_STEP_SAMPLE_RATE": "0.1",
        "DSPARK_PROMETHEUS_PORT": "9464",
        "OTEL_EXPORTER_OTLP_HEADERS": "x-token=abc",
    }
    assert TelemetryConfig().env_vars() == {}


@pytest.mark.parametrize(
    "block, field",
    [
        ({"otlp_protocol": "http/json"}, "otlp_protocol"),
        ({"traces_sampler": "sometimes"}, "traces_sampler"),
        ({"traces_sampler_arg": 2}, "traces_sampler_arg"),
        ({"step_sample_rate": -0.1}, "step_sample_rate"),
        ({"prometheus_port": 0}, "prometheus_port"),
        ({"env": {"PATH": "/tmp"}}, "'PATH': only OTEL_"),
        ({"exporter": "jaeger"}, "exporter"),
    ],
)
def test_bad_blocks_name_the_field(block, field):
    with pytest.raises(pydantic.ValidationError, match=field):
        AppConfig(model="m", telemetry=block)


def test_build_app_gives_every_deployment_the_variables(qwen3_dir):
    telemetry = {"otlp_endpoint": "http://collector:4317", "step_sample_rate": 1.0}
    app = {"model": str(qwen3_dir), "telemetry": telemetry, "controller": {}}
    ingress = build_app(app)._bound_deployment
    (replica, _config, controller) = ingress.init_args
    expected = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317",
        "DSPARK_TRACE_STEP_SAMPLE_RATE": "1.0",
    }
    # The ingress and the target replicas also carry the streaming path's Serve flags (deployments/app.py).
    for deployment in (ingress, replica._bound_deployment):
        assert deployment.ray_actor_options["runtime_env"] == {"env_vars": expected | STREAMING_ENV}
    assert controller._bound_deployment.ray_actor_options["runtime_env"] == {"env_vars": expected}
    # Without a block the deployments inherit the environment's telemetry untouched: no OTEL_ variable.
    plain = build_app({"model": str(qwen3_dir)})._bound_deployment
    for deployment in (plain, plain.init_args[0]._bound_deployment):
        assert deployment.ray_actor_options["runtime_env"] == {"env_vars": STREAMING_ENV}


def test_make_serve_says_where_telemetry_goes():
    off = describe({}, TelemetryConfig())
    assert off.startswith("telemetry off") and "OTEL_EXPORTER_OTLP_ENDPOINT" in off
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://localhost:4317"}
    assert describe(env, TelemetryConfig()) == (
        "telemetry: traces to http://localhost:4317 (grpc), engine steps as span events on 5% of steps; "
        "metrics to http://localhost:4317 (grpc)"
    )
    # The app's block wins over the environment; a traces-only backend turns metrics off.
    block = TelemetryConfig(step_sample_rate=1.0, prometheus_port=9464, env={"OTEL_METRICS_EXPORTER": "none"})
    assert describe(env, block) == (
        "telemetry: traces to http://localhost:4317 (grpc), engine steps as span events on 100% of steps; "
        "Prometheus /metrics on each target replica from port 9464"
    )
    assert describe({**env, "OTEL_SDK_DISABLED": "true"}, TelemetryConfig()) == (
        "telemetry off (OTEL_SDK_DISABLED=true)"
    )
    with pytest.raises(ValueError, match="OTEL_EXPORTER_OTLP_PROTOCOL"):
        describe({**env, "OTEL_EXPORTER_OTLP_PROTOCOL": "thrift"}, TelemetryConfig())
