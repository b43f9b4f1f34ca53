"""OpenTelemetry in the client, when it is installed (`pip install dspark-client[otel]`); the SDK never
needs it. Two things, both by the OpenTelemetry conventions:

- the caller's current trace context goes out with every call as gRPC metadata (W3C `traceparent`,
  through the configured propagator), so the server's spans join the caller's trace;
- each finished Generate records its token usage as `gen_ai.client.token.usage` (input and output),
  on the global meter provider or the one given as the client option `meter_provider`.
"""

from __future__ import annotations

try:
    from opentelemetry import metrics, propagate
except ImportError:  # the SDK works the same without it
    metrics = propagate = None

TOKEN_USAGE = "gen_ai.client.token.usage"
# The GenAI conventions' bucket boundaries for token counts: 1, 4, 16, ..., 4^13.
TOKEN_USAGE_BUCKETS = [4**i for i in range(14)]
_histograms: dict[int, object] = {}  # meter provider (id; 0: the global one) -> histogram


def trace_metadata() -> tuple[tuple[str, str], ...]:
    """The current trace context as metadata pairs; empty without OpenTelemetry or an active span."""
    if propagate is None:
        return ()
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return tuple(carrier.items())


def record_usage(input_tokens: int, output_tokens: int, model: str = "", meter_provider=None) -> None:
    """Record one completion's token usage (a no-op without OpenTelemetry or a configured provider)."""
    if metrics is None:
        return
    key = id(meter_provider) if meter_provider is not None else 0
    histogram = _histograms.get(key)
    if histogram is None:
        meter = metrics.get_meter("dspark_client", meter_provider=meter_provider)
        histogram = _histograms[key] = meter.create_histogram(
            TOKEN_USAGE,
            unit="{token}",
            description="Number of input and output tokens used.",
            explicit_bucket_boundaries_advisory=TOKEN_USAGE_BUCKETS,
        )
    attrs = {"gen_ai.operation.name": "text_completion", "gen_ai.provider.name": "dspark"}
    if model:
        attrs["gen_ai.request.model"] = model
    histogram.record(input_tokens, {**attrs, "gen_ai.token.type": "input"})
    histogram.record(output_tokens, {**attrs, "gen_ai.token.type": "output"})
