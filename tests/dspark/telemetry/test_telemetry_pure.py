"""The pure pieces of dspark/telemetry: names, settings from the environment, attributes, ECE, sampling."""

from __future__ import annotations

import pytest
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as ga
from opentelemetry.semconv._incubating.metrics import gen_ai_metrics as gm
from opentelemetry.semconv.attributes.error_attributes import ERROR_TYPE

from dspark.draft_budget import DraftBudget
from dspark.outputs import RequestMetrics, RoundReport, SpeculationStats, StepReport
from dspark.sampling_params import SamplingParams
from dspark.telemetry import semconv as sc
from dspark.telemetry.attributes import (
    request_attributes,
    request_timings,
    round_attributes,
    span_name,
    speculation_attributes,
    step_attributes,
    usage_attributes,
)
from dspark.telemetry.calibration import CalibrationWindow, expected_calibration_error, round_pairs
from dspark.telemetry.sampling import StepSampler
from dspark.telemetry.settings import TelemetrySettings


def test_names_match_the_semantic_conventions_package():
    assert (sc.GEN_AI_OPERATION_NAME, sc.GEN_AI_PROVIDER_NAME) == (
        ga.GEN_AI_OPERATION_NAME,
        ga.GEN_AI_PROVIDER_NAME,
    )
    assert sc.GEN_AI_REQUEST_MODEL == ga.GEN_AI_REQUEST_MODEL
    assert sc.GEN_AI_REQUEST_MAX_TOKENS == ga.GEN_AI_REQUEST_MAX_TOKENS
    assert sc.GEN_AI_REQUEST_TEMPERATURE == ga.GEN_AI_REQUEST_TEMPERATURE
    assert (sc.GEN_AI_REQUEST_TOP_P, sc.GEN_AI_REQUEST_TOP_K) == (
        ga.GEN_AI_REQUEST_TOP_P,
        ga.GEN_AI_REQUEST_TOP_K,
    )
    assert sc.GEN_AI_REQUEST_SEED == ga.GEN_AI_REQUEST_SEED
    assert sc.GEN_AI_REQUEST_STREAM == ga.GEN_AI_REQUEST_STREAM
    assert sc.GEN_AI_RESPONSE_ID == ga.GEN_AI_RESPONSE_ID
    assert sc.GEN_AI_RESPONSE_FINISH_REASONS == ga.GEN_AI_RESPONSE_FINISH_REASONS
    assert sc.GEN_AI_USAGE_INPUT_TOKENS == ga.GEN_AI_USAGE_INPUT_TOKENS
    assert sc.GEN_AI_USAGE_OUTPUT_TOKENS == ga.GEN_AI_USAGE_OUTPUT_TOKENS
    assert sc.GEN_AI_TOKEN_TYPE == ga.GEN_AI_TOKEN_TYPE
    assert sc.ERROR_TYPE == ERROR_TYPE
    assert sc.TEXT_COMPLETION == ga.GenAiOperationNameValues.TEXT_COMPLETION.value
    assert sc.CHAT == ga.GenAiOperationNameValues.CHAT.value
    assert (sc.TTFT, sc.TPOT) == (
        gm.GEN_AI_SERVER_TIME_TO_FIRST_TOKEN,
        gm.GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN,
    )
    assert sc.REQUEST_DURATION == gm.GEN_AI_SERVER_REQUEST_DURATION
    assert sc.CLIENT_TOKEN_USAGE == gm.GEN_AI_CLIENT_TOKEN_USAGE


def test_bucket_boundaries_are_the_conventions():
    assert sc.TTFT_BUCKETS[:3] == (0.001, 0.005, 0.01) and sc.TTFT_BUCKETS[-1] == 10.0
    assert len(sc.TTFT_BUCKETS) == 16 and len(sc.TPOT_BUCKETS) == 13 and len(sc.DURATION_BUCKETS) == 14
    assert sc.DURATION_BUCKETS == tuple(0.01 * 2**i for i in range(14))
    assert sc.TOKEN_USAGE_BUCKETS[0] == 1 and sc.TOKEN_USAGE_BUCKETS[-1] == 67108864
    for buckets in (sc.TTFT_BUCKETS, sc.TPOT_BUCKETS, sc.DURATION_BUCKETS, sc.TOKEN_USAGE_BUCKETS):
        assert list(buckets) == sorted(set(buckets))


# ---- settings -----------------------------------------------------------------------------------------


def test_nothing_is_exported_without_an_endpoint():
    s = TelemetrySettings.from_env({})
    assert not s.tracing and not s.metering
    assert s.traces.protocol == "grpc" and s.step_sample_rate == 0.05 and s.prometheus_port is None


def test_the_endpoint_and_protocol_of_each_signal():
    s = TelemetrySettings.from_env(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://metrics:4317",
            "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "grpc",
        }
    )
    assert (s.traces.endpoint, s.traces.protocol) == ("http://collector:4318", "http/protobuf")
    assert (s.metrics.endpoint, s.metrics.protocol) == ("http://metrics:4317", "grpc")
    assert s.tracing and s.metering


def test_exporters_none_console_and_the_sdk_switch():
    only_metrics = TelemetrySettings.from_env(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_TRACES_EXPORTER": "none"}
    )
    assert not only_metrics.tracing and only_metrics.metering
    console = TelemetrySettings.from_env({"OTEL_TRACES_EXPORTER": "console"})
    assert console.tracing and not console.metering
    off = TelemetrySettings.from_env(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_SDK_DISABLED": "true"}
    )
    assert not off.tracing and not off.metering


def test_prometheus_alone_turns_metrics_on():
    s = TelemetrySettings.from_env({"DSPARK_PROMETHEUS_PORT": "9464"})
    assert s.metering and not s.tracing and s.prometheus_port == 9464


@pytest.mark.parametrize(
    "env, variable",
    [
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "OTEL_EXPORTER_OTLP_PROTOCOL"),
        ({"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "thrift"}, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"),
        ({"OTEL_METRICS_EXPORTER": "prometheus"}, "OTEL_METRICS_EXPORTER"),
        ({"DSPARK_TRACE_STEP_SAMPLE_RATE": "1.5"}, "DSPARK_TRACE_STEP_SAMPLE_RATE"),
        ({"DSPARK_TRACE_STEP_SAMPLE_RATE": "nan"}, "DSPARK_TRACE_STEP_SAMPLE_RATE"),
        ({"DSPARK_PROMETHEUS_PORT": "70000"}, "DSPARK_PROMETHEUS_PORT"),
        ({"DSPARK_PROMETHEUS_PORT": "-1"}, "DSPARK_PROMETHEUS_PORT"),
    ],
)
def test_bad_values_name_their_variable(env, variable):
    with pytest.raises(ValueError, match=variable):
        TelemetrySettings.from_env(env)


def test_a_grpc_endpoint_without_scheme_is_warned_about(caplog):
    TelemetrySettings.from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4317"})
    assert "will use TLS" in caplog.text
    caplog.clear()
    TelemetrySettings.from_env(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4317", "OTEL_EXPORTER_OTLP_INSECURE": "true"}
    )
    TelemetrySettings.from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"})
    assert "will use TLS" not in caplog.text


# ---- attributes ---------------------------------------------------------------------------------------


def test_request_attributes():
    params = SamplingParams(
        temperature=0.7, top_p=0.9, top_k=20, max_tokens=33, seed=5, sla_class="interactive"
    )
    assert span_name(sc.CHAT, "target") == "chat target"
    assert request_attributes(sc.CHAT, "target", params) == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "dspark",
        "gen_ai.request.model": "target",
        "gen_ai.request.max_tokens": 33,
        "gen_ai.request.temperature": 0.7,
        "gen_ai.request.top_p": 0.9,
        "gen_ai.request.top_k": 20,
        "gen_ai.request.seed": 5,
        "dspark.sla_class": "interactive",
    }
    plain = request_attributes(sc.TEXT_COMPLETION, "m", SamplingParams())
    assert "gen_ai.request.seed" not in plain and "gen_ai.request.top_k" not in plain
    assert plain["dspark.sla_class"] == "default"
    assert usage_attributes("stop", 7, 3) == {
        "gen_ai.usage.input_tokens": 7,
        "gen_ai.usage.output_tokens": 3,
        "gen_ai.response.finish_reasons": ["stop"],
    }


def test_timings_from_the_engine_timestamps():
    metrics = RequestMetrics(
        arrival_time=10.5, first_scheduled_time=10.75, first_token_time=11.0, finished_time=13.0
    )
    t = request_timings(10.0, metrics, output_tokens=5)
    assert (t.time_in_queue, t.time_to_first_token, t.duration) == (0.75, 1.0, 3.0)
    assert t.time_per_output_token == 0.5  # 2 s over the 4 tokens after the first
    one = request_timings(10.0, metrics, output_tokens=1)
    assert one.time_per_output_token is None
    refused = request_timings(10.0, RequestMetrics(10.0, None, None, None), 0)
    assert (refused.time_in_queue, refused.time_to_first_token, refused.duration) == (None, None, None)


def test_speculation_attributes():
    spec = SpeculationStats(4, 10, 6, 2.5, proposed_tokens=16, accepted_by_position=(3, 2, 1))
    timings = request_timings(0.0, RequestMetrics(0.0, 0.25, 0.5, 2.0), 9)
    budget = DraftBudget(max_step_tokens=12, max_request_tokens=3, max_request_tokens_by_class={"batch": 8})
    attrs = speculation_attributes(
        spec, drafter="dspark", block_length=4, budget=budget, sla_class=None, timings=timings
    )
    assert attrs == {
        "dspark.drafter": "dspark",
        "dspark.block_length": 4,
        "dspark.rounds": 4,
        "dspark.drafted_tokens": 16,
        "dspark.verified_tokens": 10,
        "dspark.accepted_tokens": 6,
        "dspark.mean_accept_length": 2.5,
        "dspark.accepted_by_position": [3, 2, 1, 0],  # padded to the block length
        "dspark.request_cap": 3,
        "dspark.sla_class": "default",
        "dspark.budget.max_step_tokens": 12,
        "dspark.budget.max_request_tokens": 3,
        "dspark.time_in_queue": 0.25,
        "dspark.time_to_first_token": 0.5,
        "dspark.time_per_output_token": 0.1875,
    }
    batch = speculation_attributes(
        spec, drafter="d", block_length=4, budget=budget, sla_class="batch", timings=timings
    )
    assert batch["dspark.request_cap"] == 4  # the class's cap of 8, within the block
    free = speculation_attributes(
        spec, drafter="d", block_length=4, budget=DraftBudget(), sla_class=None, timings=timings
    )
    assert "dspark.budget.max_step_tokens" not in free and free["dspark.request_cap"] == 4


def test_step_attributes():
    report = StepReport(
        index=7,
        rounds=(RoundReport("a", 4, 3, 2, [0.9, 0.8, 0.5, 0.1]), RoundReport("b", 4, 4, None, None)),
        prefill_request_ids=("c",),
        num_tokens=40,
        drafting=True,
        scheduler="dspark",
        predicted_forward_s=0.02,
        forward_s=0.025,
        draft_s=0.004,
        duration_s=0.031,
    )
    assert (report.batch_size, report.verified_tokens, report.accepted_tokens) == (3, 7, 2)
    assert step_attributes(report) == {
        "dspark.step.index": 7,
        "dspark.step.batch_size": 3,
        "dspark.step.decoding": 2,
        "dspark.step.num_tokens": 40,
        "dspark.step.verified_tokens": 7,
        "dspark.step.accepted_tokens": 2,
        "dspark.step.drafting": True,
        "dspark.step.scheduler": "dspark",
        "dspark.step.predicted_forward_s": 0.02,
        "dspark.step.measured_forward_s": 0.025,
        "dspark.step.duration_s": 0.031,
    }
    assert round_attributes(report.rounds[0]) == {
        "dspark.step.request.proposed": 4,
        "dspark.step.request.verified": 3,
        "dspark.step.request.accepted": 2,
    }
    assert "dspark.step.request.accepted" not in round_attributes(report.rounds[1])  # it failed


# ---- calibration and sampling ---------------------------------------------------------------------------


def test_ece_exact_cases():
    assert expected_calibration_error([]) is None
    assert expected_calibration_error([(1.0, True)] * 5 + [(0.0, False)] * 5) == 0.0
    assert expected_calibration_error([(0.95, False)] * 4) == pytest.approx(0.95)
    # Bin [0.5, 0.6): confidence 0.55 twice, one accepted -> gap 0.05; bin [0.9, 1.0): 0.9 vs 1 -> 0.1.
    pairs = [(0.55, True), (0.55, False), (0.9, True), (0.9, True)]
    assert expected_calibration_error(pairs) == pytest.approx((2 * 0.05 + 2 * 0.1) / 4)
    assert expected_calibration_error([(0.3, True)], bins=1) == pytest.approx(0.7)
    with pytest.raises(ValueError):
        expected_calibration_error([], bins=0)


def test_rounds_become_pairs_and_the_window_slides():
    assert round_pairs([0.9, 0.6, 0.2], accepted=2) == [(0.9, True), (0.6, True), (0.2, False)]
    window = CalibrationWindow(max_rounds=2)
    assert window.error() is None
    window.add([0.95], 0)  # confident and wrong: slides out below
    window.add([], 0)  # a round without confidences counts for nothing
    window.add([1.0, 1.0], 2)
    window.add([0.0], 0)
    assert window.error() == 0.0


def test_step_sampler_takes_an_exact_even_share():
    for rate, steps in ((0.25, 100), (0.05, 1000), (1 / 3, 99)):
        sampler = StepSampler(rate)
        taken = [i for i in range(steps) if sampler.sample()]
        assert len(taken) == round(rate * steps)
        assert len({b - a for a, b in zip(taken, taken[1:])}) <= 2  # evenly spread
    assert all(StepSampler(1.0).sample() for _ in range(10))
    assert not any(StepSampler(0.0).sample() for _ in range(10))
    with pytest.raises(ValueError):
        StepSampler(1.5)
