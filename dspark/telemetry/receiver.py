"""An OTLP receiver that keeps what it is sent, decoded into plain data.

It serves the standard collector services (opentelemetry-proto's TraceService and MetricsService on
grpcio), so any OTLP/gRPC exporter reaches it at `receiver.endpoint` (http://host:port: plaintext);
with `http_port`, also OTLP/HTTP (`POST /v1/traces`, `/v1/metrics`, protobuf or JSON bodies:
dspark/telemetry/receiver_http.py) at `receiver.http_endpoint`, on a port of its own as a Collector
has (4317 gRPC, 4318 HTTP). The tests
use it as the far end of a real export, `python -m dspark.telemetry.dump` prints what it gets, and
the cluster controller hosts one as its telemetry input (deployments/controller.py).
"""

from __future__ import annotations

import threading
from concurrent import futures
from dataclasses import dataclass, field

import grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from dspark.telemetry.receiver_http import OtlpHttpServer, routes

KINDS = {0: "UNSPECIFIED", 1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}


def value_of(v: AnyValue):
    """An attribute value as Python data."""
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [value_of(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: value_of(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, kind) if kind else None


def attributes_of(kvs) -> dict:
    return {kv.key: value_of(kv.value) for kv in kvs}


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    trace_id: str  # 32 hex digits
    span_id: str  # 16 hex digits
    parent_span_id: str  # "" for a root
    kind: str
    start_ns: int
    end_ns: int
    attributes: dict
    events: list[tuple[str, int, dict]]  # (name, time_ns, attributes)
    status_code: int  # 0 unset, 1 ok, 2 error
    resource: dict


@dataclass(frozen=True)
class ReceivedPoint:
    metric: str
    kind: str  # "histogram" | "sum" | "gauge"
    attributes: dict
    value: float | None  # sums and gauges
    count: int | None = None  # histograms
    total: float | None = None
    bounds: list[float] = field(default_factory=list)
    resource: dict = field(default_factory=dict)


class OTLPReceiver:
    def __init__(self, host: str = "127.0.0.1", port: int = 0, http_port: int | None = None) -> None:
        self._lock = threading.Lock()
        self._spans: list[ReceivedSpan] = []
        self._points: list[ReceivedPoint] = []
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_Traces(self), self._server)
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(_Metrics(self), self._server)
        self.port = self._server.add_insecure_port(f"{host}:{port}")
        self.host = host
        self._server.start()
        self._http = (
            None
            if http_port is None
            else OtlpHttpServer(host, http_port, routes(self._add_spans, self._add_metrics))
        )

    @property
    def endpoint(self) -> str:
        """For OTEL_EXPORTER_OTLP_ENDPOINT; the http:// scheme tells the gRPC exporter: no TLS."""
        return f"http://{self.host}:{self.port}"

    @property
    def http_port(self) -> int | None:
        return None if self._http is None else self._http.port

    @property
    def http_endpoint(self) -> str | None:
        """For OTEL_EXPORTER_OTLP_ENDPOINT with protocol http/protobuf (the exporter appends /v1/...)."""
        return None if self._http is None else f"http://{self.host}:{self.http_port}"

    def spans(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self._spans)

    def points(self, metric: str | None = None) -> list[ReceivedPoint]:
        with self._lock:
            return [p for p in self._points if metric is None or p.metric == metric]

    def drain(self) -> tuple[list[ReceivedSpan], list[ReceivedPoint]]:
        """Everything received since the previous drain, handed over and forgotten: for a long-running
        consumer (the cluster controller) that must not keep every span it was ever sent."""
        with self._lock:
            spans, points = self._spans, self._points
            self._spans, self._points = [], []
        return spans, points

    def close(self) -> None:
        self._server.stop(grace=None)
        if self._http is not None:
            self._http.close()

    def _add_spans(self, request) -> None:
        received = []
        for rs in request.resource_spans:
            resource = attributes_of(rs.resource.attributes)
            for ss in rs.scope_spans:
                for s in ss.spans:
                    received.append(
                        ReceivedSpan(
                            s.name,
                            s.trace_id.hex(),
                            s.span_id.hex(),
                            s.parent_span_id.hex(),
                            KINDS.get(s.kind, str(s.kind)),
                            s.start_time_unix_nano,
                            s.end_time_unix_nano,
                            attributes_of(s.attributes),
                            [(e.name, e.time_unix_nano, attributes_of(e.attributes)) for e in s.events],
                            s.status.code,
                            resource,
                        )
                    )
        with self._lock:
            self._spans.extend(received)

    def _add_metrics(self, request) -> None:
        received = []
        for rm in request.resource_metrics:
            resource = attributes_of(rm.resource.attributes)
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    kind = m.WhichOneof("data")
                    for p in getattr(m, kind).data_points:
                        attrs = attributes_of(p.attributes)
                        if kind == "histogram":
                            point = ReceivedPoint(
                                m.name, kind, attrs, None, p.count, p.sum, list(p.explicit_bounds), resource
                            )
                        else:
                            value = p.as_double if p.WhichOneof("value") == "as_double" else p.as_int
                            point = ReceivedPoint(m.name, kind, attrs, value, resource=resource)
                        received.append(point)
        with self._lock:
            self._points.extend(received)


class _Traces(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, receiver: OTLPReceiver) -> None:
        self.receiver = receiver

    def Export(self, request, context):
        self.receiver._add_spans(request)
        return trace_service_pb2.ExportTraceServiceResponse()


class _Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):
    def __init__(self, receiver: OTLPReceiver) -> None:
        self.receiver = receiver

    def Export(self, request, context):
        self.receiver._add_metrics(request)
        return metrics_service_pb2.ExportMetricsServiceResponse()
