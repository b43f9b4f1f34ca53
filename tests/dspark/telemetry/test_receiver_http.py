"""The OTLP receiver's OTLP/HTTP side (dspark/telemetry/receiver_http.py): the OpenTelemetry SDK's own
OTLP/HTTP exporters send to it, OTLP JSON is read with its hex ids, and bad requests get OTLP/HTTP's
status codes."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from dspark.telemetry import semconv as sc
from dspark.telemetry.receiver import OTLPReceiver
from dspark.telemetry.setup import setup_telemetry
from dspark.telemetry.spans import RequestSpan

OTEL_VARS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_COMPRESSION")


@pytest.fixture
def receiver():
    r = OTLPReceiver(http_port=0)
    yield r
    r.close()


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_the_sdk_otlp_http_exporters_reach_the_receiver(receiver, monkeypatch, compression):
    for name in OTEL_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.http_endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_COMPRESSION", compression)
    telemetry = setup_telemetry("replica", {"dspark.replica.id": "r3"}, set_global=False)
    try:
        RequestSpan(telemetry.tracer, sc.CHAT, "target").finish("stop", 5, 7, {sc.ACCEPTED_TOKENS: 4})
        telemetry.meter.create_counter("dspark.test.calls").add(3, {"k": "v"})
        telemetry.flush()
    finally:
        telemetry.shutdown()

    (span,) = receiver.spans()
    assert span.name == "chat target" and span.attributes[sc.ACCEPTED_TOKENS] == 4
    assert (span.resource["dspark.role"], span.resource["dspark.replica.id"]) == ("replica", "r3")
    points = receiver.points("dspark.test.calls")  # cumulative: the flush's and the shutdown's exports
    assert points and {(p.kind, p.value, json.dumps(p.attributes)) for p in points} == {
        ("sum", 3, '{"k": "v"}')
    }
    assert receiver.endpoint != receiver.http_endpoint  # gRPC and HTTP on ports of their own


def post(receiver: OTLPReceiver, path: str, body: bytes, content_type: str, **headers) -> tuple[int, bytes]:
    request = urllib.request.Request(
        receiver.http_endpoint + path, data=body, headers={"Content-Type": content_type, **headers}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


TRACE_JSON = {
    "resourceSpans": [
        {
            "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "collector"}}]},
            "scopeSpans": [
                {
                    "spans": [
                        {
                            "traceId": "5b8efff798038103d269b633813fc60c",
                            "spanId": "eee19b7ec3c1b174",
                            "parentSpanId": "eee19b7ec3c1b173",
                            "name": "chat target",
                            "kind": 2,
                            "startTimeUnixNano": "1544712660000000000",
                            "endTimeUnixNano": "1544712661000000000",
                            "attributes": [{"key": "dspark.accepted_tokens", "value": {"intValue": "4"}}],
                        }
                    ]
                }
            ],
        }
    ]
}
METRIC_JSON = {
    "resourceMetrics": [
        {
            "scopeMetrics": [
                {
                    "metrics": [
                        {
                            "name": "dspark.confidence.calibration_error",
                            "gauge": {"dataPoints": [{"asDouble": 0.07, "timeUnixNano": "1"}]},
                        }
                    ]
                }
            ]
        }
    ]
}


def test_otlp_json_bodies_with_hex_ids(receiver):
    assert post(receiver, "/v1/traces", json.dumps(TRACE_JSON).encode(), "application/json") == (200, b"{}")
    (span,) = receiver.spans()
    assert (span.trace_id, span.span_id, span.parent_span_id) == (
        "5b8efff798038103d269b633813fc60c",
        "eee19b7ec3c1b174",
        "eee19b7ec3c1b173",
    )
    assert (span.kind, span.start_ns, span.attributes) == (
        "SERVER",
        1544712660000000000,
        {"dspark.accepted_tokens": 4},
    )
    assert span.resource == {"service.name": "collector"}
    status, _ = post(
        receiver, "/v1/metrics", json.dumps(METRIC_JSON).encode(), "application/json; charset=utf-8"
    )
    assert status == 200
    (point,) = receiver.points()
    assert (point.metric, point.kind, point.value) == ("dspark.confidence.calibration_error", "gauge", 0.07)


def test_bad_requests_get_otlp_http_status_codes(receiver):
    status, body = post(receiver, "/v1/traces", b"\x0a\xff", "application/x-protobuf")
    assert status == 400 and b"ExportTraceServiceRequest" in body
    status, body = post(receiver, "/v1/metrics", b"{not json", "application/json")
    assert status == 400 and b"ExportMetricsServiceRequest" in body
    assert post(receiver, "/v1/traces", b"", "text/plain")[0] == 415
    assert post(receiver, "/v1/logs", b"", "application/x-protobuf")[0] == 404
    status, body = post(receiver, "/v1/traces", b"", "application/x-protobuf", **{"Content-Encoding": "br"})
    assert status == 400 and b"Content-Encoding" in body
    assert receiver.spans() == [] and receiver.points() == []
    # An empty protobuf body is an empty, valid request.
    assert post(receiver, "/v1/traces", b"", "application/x-protobuf") == (200, b"")
