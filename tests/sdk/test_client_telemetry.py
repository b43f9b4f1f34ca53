"""dspark_client and OpenTelemetry: the caller's trace context goes out as gRPC metadata on every
attempt, token usage is recorded by the GenAI conventions, and without OpenTelemetry nothing changes."""

from __future__ import annotations

import subprocess
import sys

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from test_client_options import FAST, FlakyGeneration, serve

import dspark_client


def test_the_callers_trace_context_reaches_the_server_on_every_attempt():
    servicer = FlakyGeneration(failures=1)
    server, target = serve(servicer)
    tracer = TracerProvider().get_tracer("caller")
    try:
        with dspark_client.Client(target, retry=FAST) as client:
            with tracer.start_as_current_span("caller's work") as span:
                client.generate("hi")
            client.generate("no span now")
    finally:
        server.stop(None)
    ctx = span.get_span_context()
    with_span, without = servicer.metadata[:2], servicer.metadata[2]
    for metadata in with_span:  # the refused attempt and its retry
        version, trace_id, parent_id, _flags = metadata["traceparent"].split("-")
        assert (version, trace_id, parent_id) == ("00", f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}")
    assert "traceparent" not in without


def test_token_usage_is_recorded_by_the_conventions():
    reader = InMemoryMetricReader()
    servicer = FlakyGeneration(failures=0)
    server, target = serve(servicer)
    try:
        with dspark_client.Client(target, meter_provider=MeterProvider(metric_readers=[reader])) as client:
            client.generate("hi", model="target")
    finally:
        server.stop(None)
    (metric,) = [
        m for rm in reader.get_metrics_data().resource_metrics for sm in rm.scope_metrics for m in sm.metrics
    ]
    assert (metric.name, metric.unit) == ("gen_ai.client.token.usage", "{token}")
    by_type = {p.attributes["gen_ai.token.type"]: p for p in metric.data.data_points}
    assert (by_type["input"].sum, by_type["output"].sum) == (1, 1)  # FlakyGeneration's usage
    assert by_type["input"].attributes == {
        "gen_ai.operation.name": "text_completion",
        "gen_ai.provider.name": "dspark",
        "gen_ai.request.model": "target",
        "gen_ai.token.type": "input",
    }
    assert list(by_type["input"].explicit_bounds) == [4**i for i in range(14)]


def test_the_sdk_works_without_opentelemetry():
    code = (
        "import sys; sys.modules['opentelemetry'] = None\n"  # makes `import opentelemetry` fail
        "import dspark_client\n"
        "from dspark_client import telemetry\n"
        "assert telemetry.propagate is None and telemetry.trace_metadata() == ()\n"
        "telemetry.record_usage(3, 4)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
