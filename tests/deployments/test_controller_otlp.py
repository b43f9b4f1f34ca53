"""The controller's OTLP input end to end in one process: a real engine's replica telemetry
(EngineTelemetry on the real OpenTelemetry SDK, its OTLP/gRPC or OTLP/HTTP exporters configured from
the environment build_app gives the replicas) exports to the controller's receiver, and the
controller's view of the replica (ReplicaTelemetry) carries what the engine measured: TTFT/TPOT per
SLA class, the calibration error, and the forward slowdown from the sampled steps."""

from __future__ import annotations

import pytest
from serving import free_port, wait_until

from controller.telemetry import ClassStats, ReplicaTelemetry
from deployments.app import controller_export_env
from deployments.config import AppConfig
from deployments.controller_otlp import ExportedTelemetry
from dspark.config import EngineConfig
from dspark.cost_table import CostTable
from dspark.engine import Engine
from dspark.sampling_params import SamplingParams
from dspark.telemetry import semconv as sc
from dspark.telemetry.engine_telemetry import EngineTelemetry
from dspark.telemetry.setup import setup_telemetry

OTEL_VARS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_METRIC_EXPORT_INTERVAL")


def test_app_config_points_the_replicas_at_the_controller(qwen3_dir):
    base = {"model": str(qwen3_dir), "controller": {"otlp_port": 4999, "period_s": 2}}
    assert controller_export_env(AppConfig(**base)) == {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4999",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
        "OTEL_METRIC_EXPORT_INTERVAL": "2000",
    }
    # A collector of the app's own: it fans out to the controller, the replicas export to it.
    with_collector = AppConfig(**base, telemetry={"otlp_endpoint": "http://collector:4317"})
    assert controller_export_env(with_collector) == {}
    assert controller_export_env(AppConfig(model=str(qwen3_dir), controller={})) == {}
    with pytest.raises(ValueError, match="otlp_port"):
        AppConfig(**{**base, "controller": {"otlp_port": 70000}})
    # OTLP/HTTP beside gRPC; the replicas export over it when told to.
    http = {"otlp_port": 4999, "otlp_http_port": 5000, "period_s": 2}
    assert controller_export_env(AppConfig(**{**base, "controller": http}))[
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    ] == ("http://127.0.0.1:4999")
    over_http = controller_export_env(
        AppConfig(**{**base, "controller": {**http, "otlp_protocol": "http/protobuf"}})
    )
    assert over_http == {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:5000",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_METRIC_EXPORT_INTERVAL": "2000",
    }
    for wrong, field in (
        ({"otlp_http_port": 5000}, "otlp_http_port needs otlp_port"),
        ({"otlp_port": 4999, "otlp_protocol": "http/protobuf"}, "needs otlp_http_port"),
        ({"otlp_port": 4999, "otlp_http_port": 4999}, "must differ"),
    ):
        with pytest.raises(ValueError, match=field):
            AppConfig(**{**base, "controller": wrong})


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_a_replicas_export_reaches_the_controllers_view(qwen3_dir, monkeypatch, protocol):
    exported, telemetry = ExportedTelemetry("127.0.0.1", free_port(), free_port()), None
    try:
        ports = {"otlp_port": exported.receiver.port, "otlp_http_port": exported.receiver.http_port}
        config = AppConfig(model=str(qwen3_dir), controller={**ports, "otlp_protocol": protocol})
        for name in OTEL_VARS:
            monkeypatch.delenv(name, raising=False)
        for name, value in controller_export_env(config).items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("DSPARK_TRACE_STEP_SAMPLE_RATE", "1.0")
        telemetry = setup_telemetry("replica", {sc.REPLICA_ID: "r0"}, set_global=False, prometheus=False)
        assert telemetry.tracing and telemetry.metering
        engine = Engine(
            EngineConfig(model=str(qwen3_dir), drafter="ngram", scheduler="dspark", num_kv_pages=32),
            cost_table=CostTable([1, 8, 64], [200.0, 150.0, 40.0], 64),
        )
        traced = EngineTelemetry(telemetry, engine, "target", "r0")
        params = {
            "chat": SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, sla_class="chat"),
            "batch": SamplingParams(temperature=0, max_tokens=14, ignore_eos=True, sla_class="batch"),
        }
        traces, finals, reports = {}, {}, []
        engine.step_observers.append(reports.append)
        for i, (cls, p) in enumerate(params.items()):
            rid = engine.add_request([5, 6, 7, 5, 6, 7, 5, 6 + i], p, request_id=f"e{i}")
            traces[rid] = (cls, traced.start(rid, f"label{i}", sc.TEXT_COMPLETION, p))
        while engine.has_unfinished():
            for out in engine.step():
                if out.finished:
                    finals[out.request_id] = (
                        traces[out.request_id][0],
                        traces[out.request_id][1].finished(out),
                    )
        traced.metrics.calibration.add([0.9, 0.6, 0.3], 1)  # the rounds' confidences, if ngram gave none
        telemetry.flush()

        # The controller's snapshot of r0 from its broadcast reading: no latencies, table as profiled.
        snapshots = {"r0": ReplicaTelemetry("r0", 0.0, running=0, queued=0, max_num_seqs=8, window=4)}
        got: dict = {}

        def merged():
            got.update(snapshots)
            exported.apply(got)
            view = got["r0"]
            return view if {"chat", "batch"} <= set(view.classes) and view.forward_slowdown != 1.0 else None

        view = wait_until(merged, timeout_s=30, what="the replica's export in the controller's view")
        for cls, attrs in finals.values():
            assert view.classes[cls] == ClassStats(
                running=0, ttft_s=attrs[sc.TIME_TO_FIRST_TOKEN], tpot_s=attrs[sc.TIME_PER_OUTPUT_TOKEN]
            )
        timed = [r for r in reports if r.predicted_forward_s is not None]
        assert len(timed) > 0
        slowdown = sum(r.forward_s for r in timed) / sum(r.predicted_forward_s for r in timed)
        assert view.forward_slowdown == pytest.approx(slowdown)
        assert view.calibration_error == pytest.approx(traced.metrics.calibration.error())
        assert exported.state()["received"]["spans"] >= 2
        assert exported.state()["http_endpoint"] == f"http://127.0.0.1:{exported.receiver.http_port}"
    finally:
        if telemetry is not None:
            telemetry.shutdown()
        exported.close()
