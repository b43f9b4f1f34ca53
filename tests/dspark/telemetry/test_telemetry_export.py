"""Telemetry leaving a process for real: OTLP over gRPC and over HTTP to receivers in the test, and the
Prometheus endpoint scraped over HTTP. Exported names are derived from the instrument definitions."""

from __future__ import annotations

import http.server
import threading
import urllib.request

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.trace import SpanKind
from prometheus_client.parser import text_string_to_metric_families
from serving import free_port

from dspark.config import EngineConfig
from dspark.cost_table import CostTable
from dspark.engine import Engine
from dspark.outputs import RequestMetrics
from dspark.sampling_params import SamplingParams
from dspark.telemetry import semconv as sc
from dspark.telemetry.attributes import metric_attributes, request_timings
from dspark.telemetry.dump import format_trace
from dspark.telemetry.metrics import INSTRUMENTS, EngineMetrics
from dspark.telemetry.prometheus import PrometheusEndpoint, prometheus_series
from dspark.telemetry.receiver import OTLPReceiver
from dspark.telemetry.setup import setup_telemetry
from dspark.telemetry.spans import RequestSpan

OTEL_VARS = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_SERVICE_NAME",
    "DSPARK_PROMETHEUS_PORT",
)


@pytest.fixture
def clean_env(monkeypatch):
    for name in OTEL_VARS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def served_engine(qwen3_dir) -> Engine:
    """A real engine after one request, with a cost table (so the SPS gauges have points)."""
    config = EngineConfig(model=str(qwen3_dir), drafter="ngram", scheduler="dspark", num_kv_pages=32)
    engine = Engine(config, cost_table=CostTable([1, 8, 64], [200.0, 150.0, 40.0], 64))
    engine.add_request(
        [5, 6, 7, 5, 6, 7, 5, 6], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    )
    while engine.has_unfinished():
        engine.step()
    return engine


def scrape(port: int) -> dict[str, list]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    samples: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.setdefault(s.name, []).append(s)
    return samples


def test_prometheus_names_are_what_the_instruments_say(qwen3_dir, clean_env):
    engine = served_engine(qwen3_dir)
    clean_env.setenv("DSPARK_PROMETHEUS_PORT", str(free_port()))
    telemetry = setup_telemetry("replica", set_global=False)
    try:
        metrics = EngineMetrics(telemetry.meter, engine, "target", "r0")
        timings = request_timings(0.0, RequestMetrics(0.0, 0.1, 0.2, 1.0), 9)
        metrics.record_request(metric_attributes(sc.TEXT_COMPLETION, "target", None), timings, None)
        metrics.verify_tokens.record(4, {})
        metrics.calibration.add([0.9, 0.5], 1)
        samples = scrape(telemetry.prometheus.port)
    finally:
        telemetry.shutdown()

    expected = {name for instrument in INSTRUMENTS for name in prometheus_series(instrument)}
    assert expected <= set(samples), sorted(expected - set(samples))
    assert set(samples) - expected == {"target_info"}  # and nothing else
    # vLLM's names, in our namespace, with vLLM's labels.
    (drafts,) = samples["dspark:spec_decode_num_drafts_total"]
    assert drafts.value == engine.stats.rounds > 0 and drafts.labels == {"model_name": "target"}
    (accepted,) = samples["dspark:spec_decode_num_accepted_tokens_total"]
    assert accepted.value == engine.stats.accepted_tokens
    (verified,) = samples["dspark:spec_decode_num_draft_tokens_total"]
    assert verified.value == engine.stats.drafted_tokens
    per_pos = {
        s.labels["position"]: s.value for s in samples["dspark:spec_decode_num_accepted_tokens_per_pos_total"]
    }
    assert (
        sorted(per_pos) == [str(i) for i in range(engine.gamma)] and sum(per_pos.values()) == accepted.value
    )
    buckets = [s.labels["le"] for s in samples["gen_ai_server_time_to_first_token_seconds_bucket"]]
    assert [float(b) for b in buckets[:-1]] == list(sc.TTFT_BUCKETS) and buckets[-1] == "+Inf"
    assert samples["dspark:confidence_calibration_error"][0].value == pytest.approx((0.1 + 0.5) / 2)


def test_replicas_on_one_node_take_the_next_free_port():
    base = free_port()
    first = PrometheusEndpoint(base)
    try:
        second = PrometheusEndpoint(base)
        try:
            assert second.port == first.port + 1
        finally:
            second.close()
    finally:
        first.close()


def test_otlp_grpc_export_from_the_standard_environment(clean_env):
    receiver = OTLPReceiver()
    clean_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    clean_env.setenv("OTEL_SERVICE_NAME", "dspark-test")
    clean_env.setenv("OTEL_RESOURCE_ATTRIBUTES", "k8s.pod.name=pod-1,deployment.environment=ci")
    telemetry = setup_telemetry("replica", {"dspark.replica.id": "r7"}, set_global=False)
    try:
        assert telemetry.tracing and telemetry.metering and telemetry.prometheus is None
        parent = RequestSpan(telemetry.tracer, sc.CHAT, "target")
        child = RequestSpan(telemetry.tracer, sc.CHAT, "target", parent.carrier(), SpanKind.INTERNAL)
        child.span.add_event(sc.STEP_EVENT, {sc.STEP_INDEX: 1, sc.STEP_BATCH_SIZE: 2})
        child.finish("stop", 5, 7, {sc.ACCEPTED_TOKENS: 4})
        parent.finish("stop", 5, 7)
        histogram = telemetry.meter.create_histogram(
            sc.TTFT, unit="s", explicit_bucket_boundaries_advisory=list(sc.TTFT_BUCKETS)
        )
        histogram.record(0.03, {sc.GEN_AI_OPERATION_NAME: "chat"})
        telemetry.flush()
    finally:
        telemetry.shutdown()
        receiver.close()

    spans = {s.kind: s for s in receiver.spans()}
    server, internal = spans["SERVER"], spans["INTERNAL"]
    assert internal.parent_span_id == server.span_id and internal.trace_id == server.trace_id
    assert (
        internal.attributes[sc.ACCEPTED_TOKENS] == 4
        and internal.attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 7
    )
    assert server.name == "chat target" and internal.events[0][0] == sc.STEP_EVENT
    resource = server.resource
    assert resource["service.name"] == "dspark-test" and resource["k8s.pod.name"] == "pod-1"
    assert (resource["dspark.role"], resource["dspark.replica.id"]) == ("replica", "r7")
    assert "process.pid" in resource and "host.name" in resource
    (point, *_) = receiver.points(sc.TTFT)
    assert point.kind == "histogram" and point.count == 1 and point.bounds == list(sc.TTFT_BUCKETS)

    text = format_trace(receiver.spans())
    assert text.splitlines()[0] == f"trace {server.trace_id}"
    assert "└─ chat target  [SERVER" in text and "   └─ chat target  [INTERNAL" in text
    assert "dspark.accepted_tokens = 4" in text and "• dspark.step @+" in text and "batch_size=2" in text


class _OTLPHttp(http.server.BaseHTTPRequestHandler):
    received: dict[str, bytes] = {}

    def do_POST(self):
        self.received[self.path] = self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args):
        pass


def test_otlp_http_protobuf_export(clean_env):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _OTLPHttp)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    clean_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{server.server_port}")
    clean_env.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    telemetry = setup_telemetry("ingress", set_global=False)
    try:
        RequestSpan(telemetry.tracer, sc.TEXT_COMPLETION, "target").finish("length", 3, 4)
        telemetry.meter.create_counter("dspark.test.calls").add(1)
        telemetry.flush()
    finally:
        telemetry.shutdown()
        server.shutdown()

    traces = ExportTraceServiceRequest.FromString(_OTLPHttp.received["/v1/traces"])
    (span,) = [s for rs in traces.resource_spans for ss in rs.scope_spans for s in ss.spans]
    assert span.name == "text_completion target"
    metrics = ExportMetricsServiceRequest.FromString(_OTLPHttp.received["/v1/metrics"])
    names = {m.name for rm in metrics.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    assert names == {"dspark.test.calls"}
