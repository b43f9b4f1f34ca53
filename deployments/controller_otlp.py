"""The controller's telemetry input: an OTLP receiver (gRPC, and HTTP with `http_port`) the replicas (or
a Collector) export to, and
the fold (controller/otlp.py) that turns each period's spans and points into per-replica measurements
laid over the broadcast snapshots."""

from __future__ import annotations

from collections.abc import MutableMapping

from controller.otlp import OtlpFold, merge
from controller.telemetry import ReplicaTelemetry
from dspark.telemetry.receiver import OTLPReceiver

LOOPBACK = ("127.0.0.1", "localhost", "::1")


class ExportedTelemetry:
    def __init__(self, host: str, port: int, http_port: int | None = None) -> None:
        # `host` is where replicas reach the receiver: a loopback address is bound as such; any other
        # (a node or Service name) may not be one of this process's interfaces, so every one is bound.
        self.receiver = OTLPReceiver(host if host in LOOPBACK else "0.0.0.0", port, http_port)
        self.advertised = f"http://{host}:{self.receiver.port}"
        self.http_advertised = None if http_port is None else f"http://{host}:{self.receiver.http_port}"
        self.fold = OtlpFold()
        self.received = {"spans": 0, "points": 0}

    @property
    def endpoint(self) -> str:
        return self.advertised

    def apply(self, snapshots: MutableMapping[str, ReplicaTelemetry]) -> list[str]:
        """Ends the period: what arrived since the previous call, merged into the snapshots of the
        replicas it names (in place). Returns the replicas updated; an unknown one is left out (its
        broadcast reading, which carries its load, has not come yet)."""
        spans, points = self.receiver.drain()
        self.received["spans"] += len(spans)
        self.received["points"] += len(points)
        self.fold.add_spans(spans)
        self.fold.add_points(points)
        updated = []
        for rid, measured in self.fold.window().items():
            if rid in snapshots:
                snapshots[rid] = merge(snapshots[rid], measured)
                updated.append(rid)
        return updated

    def forget(self, replica_id: str) -> None:
        self.fold.forget(replica_id)

    def state(self) -> dict:
        return {
            "endpoint": self.endpoint,
            "http_endpoint": self.http_advertised,
            "received": dict(self.received),
        }

    def close(self) -> None:
        self.receiver.close()
