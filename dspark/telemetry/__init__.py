"""OpenTelemetry for the serving kit (docs/ARCHITECTURE.md, telemetry).

- settings.py, setup.py: providers for a serving process from the standard OTEL_* environment
- semconv.py, attributes.py: names, bucket boundaries and span attributes (GenAI conventions plus our
  `dspark.*` speculation attributes); calibration.py, sampling.py: the pure pieces behind them
- spans.py, engine_telemetry.py: request spans on the ingress and the replica, step events, metrics
- metrics.py, prometheus.py: every instrument, defined once, and the Prometheus scrape endpoint
- receiver.py, dump.py: an OTLP/gRPC receiver and `python -m dspark.telemetry.dump` (span trees as text)

The engine itself never imports this package: it hands out plain reports (dspark/outputs.py). The
package's own __init__ imports nothing, so its pure modules load without the SDK.
"""
