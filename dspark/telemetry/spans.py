"""A request's span on a serving hop, and the W3C trace context that links the hops.

The ingress starts one from the client's context (HTTP headers or gRPC metadata, W3C
`traceparent`); its context travels to the replica as a plain dict (a keyword argument of
TargetReplica.generate), where the replica's span continues the same trace.
"""

from __future__ import annotations

from collections.abc import Mapping

from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from dspark.sampling_params import SamplingParams
from dspark.telemetry import semconv as sc
from dspark.telemetry.attributes import (
    Attributes,
    error_type,
    request_attributes,
    span_name,
    usage_attributes,
)


def extract(carrier: Mapping[str, str] | None):
    """The remote parent context in `carrier` (headers, metadata, a dict); None without a carrier."""
    return propagate.extract(carrier) if carrier else None


class RequestSpan:
    """One request's span on one hop; ends once, on `finish`, `fail` or `end`."""

    def __init__(
        self,
        tracer: trace.Tracer,
        operation: str,
        model: str,
        carrier: Mapping[str, str] | None = None,
        kind: SpanKind = SpanKind.SERVER,
    ) -> None:
        self.operation, self.model = operation, model
        self.span = tracer.start_span(
            span_name(operation, model),
            context=extract(carrier),
            kind=kind,
            attributes=request_attributes(operation, model),
        )
        self.ended = False

    @property
    def recording(self) -> bool:
        return self.span.is_recording()

    def set_request(self, params: SamplingParams, model: str | None = None, **extra) -> None:
        """How the request is sampled, and the model it asked for (default: the served one)."""
        if self.recording:
            self.span.set_attributes(
                {**request_attributes(self.operation, model or self.model, params), **extra}
            )

    def set(self, attributes: Attributes) -> None:
        if self.recording:
            self.span.set_attributes(attributes)

    def add_event(self, name: str, attributes: Attributes) -> None:
        if self.recording:
            self.span.add_event(name, attributes)

    def carrier(self) -> dict[str, str] | None:
        """This span's context for the next hop as W3C headers; None when it is not recorded."""
        if not self.recording:
            return None
        carrier: dict[str, str] = {}
        propagate.inject(carrier, context=trace.set_span_in_context(self.span))
        return carrier

    def finish(
        self,
        finish_reason: str | None,
        input_tokens: int,
        output_tokens: int,
        speculation: Attributes | None = None,
    ) -> None:
        """A response came to its end: usage, finish reason and the replica's speculation attributes."""
        if self.ended:
            return
        if self.recording:
            self.span.set_attributes(
                {**usage_attributes(finish_reason, input_tokens, output_tokens), **(speculation or {})}
            )
        self.end()

    def fail(self, exc: BaseException, server_fault: bool = True) -> None:
        """The request failed: `error.type`, and an error status when the fault is the server's
        (a refused request, 4xx, is the client's: status left unset, as HTTP server spans do)."""
        if self.ended:
            return
        if self.recording:
            self.span.set_attribute(sc.ERROR_TYPE, error_type(exc))
            self.span.record_exception(exc)
            if server_fault:
                self.span.set_status(Status(StatusCode.ERROR, str(exc)[:256]))
        self.end()

    def end(self) -> None:
        if not self.ended:
            self.ended = True
            self.span.end()
