"""OTLP/HTTP for the OTLP receiver: `POST /v1/traces` and `POST /v1/metrics` (the spec's paths).

Bodies are the same Export*ServiceRequest messages the gRPC services take, as binary protobuf
(`application/x-protobuf`) or as OTLP's JSON (`application/json`: proto3 JSON with lowerCamelCase
keys, except that trace and span ids are hex strings, not base64), optionally gzip- or
deflate-compressed (`Content-Encoding`). A success answers the matching Export*ServiceResponse in the
request's encoding. A body that does not decode is a 400 naming why, another media type a 415, another
path a 404 (OTLP/HTTP's status codes: the exporter retries none of them).
"""

from __future__ import annotations

import base64
import gzip
import json
import socket
import threading
import zlib
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

PROTOBUF, JSON = "application/x-protobuf", "application/json"
MAX_BODY_BYTES = 64 << 20  # larger than any batch an SDK exporter sends (512 spans by default)
# Byte fields OTLP's JSON writes as hex: spans, their parents and links, and metric exemplars.
HEX_IDS = ("traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id")


def _hex_ids_to_base64(node):
    """OTLP JSON's hex ids in the base64 that protobuf's JSON parser expects for bytes fields."""
    if isinstance(node, dict):
        return {
            k: base64.b64encode(bytes.fromhex(v)).decode()
            if k in HEX_IDS and isinstance(v, str)
            else _hex_ids_to_base64(v)
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [_hex_ids_to_base64(v) for v in node]
    return node


def decode(body: bytes, content_type: str, encoding: str, message: type[Message]) -> Message:
    """The request message in `body`; ValueError saying why it is not one."""
    if encoding == "gzip":
        body = gzip.decompress(body)
    elif encoding == "deflate":
        body = zlib.decompress(body)
    elif encoding not in ("", "identity"):
        raise ValueError(f"Content-Encoding {encoding!r} is not one of gzip, deflate, identity")
    if content_type == PROTOBUF:
        try:
            return message.FromString(body)
        except DecodeError as exc:
            raise ValueError(f"body is not a protobuf {message.DESCRIPTOR.name}: {exc}") from None
    try:
        return json_format.ParseDict(_hex_ids_to_base64(json.loads(body)), message())
    except (ValueError, json_format.ParseError) as exc:
        raise ValueError(f"body is not OTLP JSON {message.DESCRIPTOR.name}: {exc}") from None


# path -> (request message, response message, what the receiver does with a request)
Routes = dict[str, tuple[type[Message], type[Message], Callable[[Message], None]]]


def routes(add_spans: Callable[[Message], None], add_metrics: Callable[[Message], None]) -> Routes:
    return {
        "/v1/traces": (
            trace_service_pb2.ExportTraceServiceRequest,
            trace_service_pb2.ExportTraceServiceResponse,
            add_spans,
        ),
        "/v1/metrics": (
            metrics_service_pb2.ExportMetricsServiceRequest,
            metrics_service_pb2.ExportMetricsServiceResponse,
            add_metrics,
        ),
    }


class OtlpHttpServer:
    """A threaded HTTP server on `host:port` (0: any free port) serving `routes` until `close()`."""

    def __init__(self, host: str, port: int, table: Routes) -> None:
        handler = type("Handler", (_Handler,), {"routes": table})
        server_class = _Ipv6Server if ":" in host else ThreadingHTTPServer
        self._server = server_class((host, port), handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="otlp-http", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


class _Ipv6Server(ThreadingHTTPServer):
    address_family = socket.AF_INET6


class _Handler(BaseHTTPRequestHandler):
    routes: Routes = {}
    protocol_version = "HTTP/1.1"  # keep-alive: the exporters reuse one connection

    def log_message(self, format, *args) -> None:  # noqa: A002 - the base class's name
        pass  # no line on stderr per export

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY_BYTES:
            self._answer(413, "text/plain", f"body over {MAX_BODY_BYTES} bytes".encode(), close=True)
            return
        body = self.rfile.read(length)
        route = self.routes.get(self.path.split("?", 1)[0])
        if route is None:
            self._answer(
                404, "text/plain", f"no route {self.path}; OTLP/HTTP: /v1/traces, /v1/metrics".encode()
            )
            return
        content_type = (self.headers.get("Content-Type") or "").split(";", 1)[0].strip().lower()
        if content_type not in (PROTOBUF, JSON):
            self._answer(415, "text/plain", f"Content-Type must be {PROTOBUF} or {JSON}".encode())
            return
        request_type, response_type, handle = route
        encoding = (self.headers.get("Content-Encoding") or "").strip().lower()
        try:
            request = decode(body, content_type, encoding, request_type)
        except (ValueError, OSError, zlib.error) as exc:
            self._answer(400, "text/plain", str(exc).encode())
            return
        handle(request)
        response = response_type()
        if content_type == PROTOBUF:
            self._answer(200, PROTOBUF, response.SerializeToString())
        else:
            self._answer(200, JSON, json_format.MessageToJson(response).encode())

    def _answer(self, status: int, content_type: str, body: bytes, close: bool = False) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)
