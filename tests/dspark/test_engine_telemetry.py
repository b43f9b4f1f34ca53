"""The engine's step reports and a replica's telemetry over them, with the real OpenTelemetry SDK and
in-memory exporters: one span per request with GenAI and speculation attributes that equal the
engine's own counts, sampled step events, and metrics that equal the engine's counters."""

from __future__ import annotations

from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from test_engine_greedy import GREEDY, prompts_of_mixed_length, reference
from test_scheduler_greedy import scheduled_engine

from dspark.draft_budget import DraftBudget
from dspark.outputs import StepReport
from dspark.telemetry import semconv as sc
from dspark.telemetry.calibration import expected_calibration_error, round_pairs
from dspark.telemetry.engine_telemetry import EngineTelemetry
from dspark.telemetry.setup import setup_telemetry
from dspark.telemetry.spans import RequestSpan


def points(reader: InMemoryMetricReader) -> dict[str, list]:
    found: dict[str, list] = {}
    for rm in reader.get_metrics_data().resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                found.setdefault(m.name, []).extend(m.data.data_points)
    return found


def traced_engine(qwen3_dir, monkeypatch, rate: str = "1.0"):
    monkeypatch.setenv("DSPARK_TRACE_STEP_SAMPLE_RATE", rate)
    spans, reader = InMemorySpanExporter(), InMemoryMetricReader()
    telemetry = setup_telemetry(
        "replica", {"dspark.replica.id": "r0"}, span_exporter=spans, metric_reader=reader, set_global=False
    )
    prompts = prompts_of_mixed_length(384)[:3]
    engine = scheduled_engine(
        qwen3_dir, prompts, reference(qwen3_dir, prompts_of_mixed_length(384))[:3], "dspark"
    )
    engine.set_draft_budget(DraftBudget(max_request_tokens=3))
    return engine, EngineTelemetry(telemetry, engine, "target", "r0"), spans, reader, prompts


def run(engine, traced: EngineTelemetry, prompts, carrier=None):
    """Every prompt as a traced request; returns the final outputs and every step report."""
    reports: list[StepReport] = []
    engine.step_observers.append(reports.append)
    traces, finals = {}, {}
    for i, p in enumerate(prompts):
        rid = engine.add_request(p, GREEDY, request_id=f"e{i}")
        traces[rid] = traced.start(rid, f"label{i}", sc.TEXT_COMPLETION, GREEDY, carrier)
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = out
                traces[out.request_id].finished(out)
    return finals, reports


def test_request_spans_carry_what_the_engine_counted(qwen3_dir, monkeypatch):
    engine, traced, spans, _, prompts = traced_engine(qwen3_dir, monkeypatch)
    parent = RequestSpan(TracerProvider().get_tracer("test"), sc.TEXT_COMPLETION, "target")
    finals, reports = run(engine, traced, prompts, parent.carrier())

    by_label = {s.attributes[sc.REQUEST_ID]: s for s in spans.get_finished_spans()}
    assert len(by_label) == 3
    for i in range(3):
        out, span = finals[f"e{i}"], by_label[f"label{i}"]
        spec, a = out.speculation, span.attributes
        assert span.name == "text_completion target" and span.kind is SpanKind.INTERNAL
        assert span.context.trace_id == parent.span.get_span_context().trace_id
        assert span.parent.span_id == parent.span.get_span_context().span_id
        assert a[sc.GEN_AI_USAGE_INPUT_TOKENS] == len(prompts[i]) and a[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 24
        assert a[sc.GEN_AI_RESPONSE_FINISH_REASONS] == ("length",)
        assert (a[sc.GEN_AI_REQUEST_MAX_TOKENS], a[sc.GEN_AI_REQUEST_TEMPERATURE]) == (24, 0)
        assert (a[sc.DRAFTER], a[sc.BLOCK_LENGTH], a[sc.REQUEST_CAP]) == ("scripted", 4, 3)
        assert a[sc.BUDGET_MAX_REQUEST_TOKENS] == 3 and sc.BUDGET_MAX_STEP_TOKENS not in a
        assert (a[sc.ROUNDS], a[sc.VERIFIED_TOKENS], a[sc.ACCEPTED_TOKENS]) == (
            spec.rounds,
            spec.drafted_tokens,
            spec.accepted_tokens,
        )
        assert a[sc.DRAFTED_TOKENS] == spec.proposed_tokens >= spec.drafted_tokens
        by_position = list(a[sc.ACCEPTED_BY_POSITION])
        assert len(by_position) == 4 and sum(by_position) == spec.accepted_tokens > 0
        assert by_position == sorted(by_position, reverse=True) and by_position[3] == 0  # cap 3
        assert a[sc.MEAN_ACCEPT_LENGTH] == spec.mean_accept_length
        assert 0 <= a[sc.TIME_IN_QUEUE] <= a[sc.TIME_TO_FIRST_TOKEN] and a[sc.TIME_PER_OUTPUT_TOKEN] > 0

        # At rate 1 every step the request took part in is an event; its own shares add up.
        mine = [
            r
            for r in reports
            if f"e{i}" in r.prefill_request_ids or any(x.request_id == f"e{i}" for x in r.rounds)
        ]
        assert [e.attributes[sc.STEP_INDEX] for e in span.events] == [r.index for r in mine]
        assert all(e.name == sc.STEP_EVENT for e in span.events)
        accepted = [
            e.attributes[sc.STEP_REQUEST_ACCEPTED]
            for e in span.events
            if sc.STEP_REQUEST_ACCEPTED in e.attributes
        ]
        assert sum(accepted) == spec.accepted_tokens
        decode_event = next(e for e in span.events if sc.STEP_REQUEST_VERIFIED in e.attributes)
        assert decode_event.attributes[sc.STEP_SCHEDULER] == "dspark"
        assert decode_event.attributes[sc.STEP_PREDICTED_FORWARD] > 0  # from the cost table
        assert decode_event.attributes[sc.STEP_MEASURED_FORWARD] > 0


def test_metrics_equal_the_engine_counters(qwen3_dir, monkeypatch):
    engine, traced, _, reader, prompts = traced_engine(qwen3_dir, monkeypatch)
    finals, reports = run(engine, traced, prompts)
    stats, found = engine.stats, points(reader)

    def value(name, **attrs):
        (point,) = [p for p in found[name] if all(p.attributes.get(k) == v for k, v in attrs.items())]
        return point.value

    assert value("dspark.spec_decode.num_drafts") == stats.rounds
    assert value("dspark.spec_decode.num_draft_tokens") == stats.drafted_tokens
    assert value("dspark.spec_decode.num_accepted_tokens") == stats.accepted_tokens
    assert value("dspark.spec_decode.num_proposed_tokens") == stats.proposed_tokens
    per_pos = {
        p.attributes["position"]: p.value for p in found["dspark.spec_decode.num_accepted_tokens_per_pos"]
    }
    assert per_pos == {str(i): n for i, n in enumerate([*stats.accepted_by_position, 0, 0, 0, 0][:4])}
    assert sum(per_pos.values()) == stats.accepted_tokens
    assert all(p.attributes["model_name"] == "target" for p in found["dspark.spec_decode.num_drafts"])

    (ttft,) = found[sc.TTFT]
    assert ttft.count == 3 and list(ttft.explicit_bounds) == list(sc.TTFT_BUCKETS)
    assert ttft.attributes == {
        sc.GEN_AI_OPERATION_NAME: "text_completion",
        sc.GEN_AI_PROVIDER_NAME: "dspark",
        sc.GEN_AI_REQUEST_MODEL: "target",
        sc.SLA_CLASS: "default",
    }
    (tpot,), (duration,) = found[sc.TPOT], found[sc.REQUEST_DURATION]
    assert (
        tpot.count == 3
        and duration.count == 3
        and list(duration.explicit_bounds) == list(sc.DURATION_BUCKETS)
    )
    (verify,) = found["dspark.step.verify_tokens"]
    decoding_steps = [r for r in reports if r.rounds]
    assert verify.count == len(decoding_steps) and verify.sum == stats.drafted_tokens

    assert value("dspark.draft_budget.step_tokens") == engine.config.max_num_batched_tokens
    assert value("dspark.draft_budget.request_tokens", **{sc.SLA_CLASS: "default"}) == 3
    table = engine.cost_table
    profiled = {p.attributes["dspark.batch_tokens"]: p.value for p in found["dspark.sps.profiled"]}
    assert profiled == dict(zip(table.points, table.profiled))
    assert len(found["dspark.sps.measured"]) == len(table.points)

    # The calibration error, recomputed from the step reports' own survival and acceptance.
    pairs = [
        pair
        for r in reports
        for x in r.rounds
        if x.survival and x.verified
        for pair in round_pairs(x.survival[: x.verified], x.accepted)
    ]
    assert value("dspark.confidence.calibration_error") == expected_calibration_error(pairs)


def test_after_attach_the_instruments_read_the_new_engine(qwen3_dir, monkeypatch):
    """A replica rebuilt its engine for another Serve rank (deployments/replica_engine.py): the same
    instruments (a meter keeps the callbacks first registered) now read the new engine's counters,
    and its steps reach the same histograms."""
    old, traced, _, reader, prompts = traced_engine(qwen3_dir, monkeypatch)
    _, old_reports = run(old, traced, prompts)
    references = reference(qwen3_dir, prompts_of_mixed_length(384))[:1]
    new = scheduled_engine(qwen3_dir, prompts[:1], references, "dspark")
    traced.attach(new)
    _, new_reports = run(new, traced, prompts[:1])
    found = points(reader)
    (drafts,) = found["dspark.spec_decode.num_drafts"]
    assert drafts.value == new.stats.rounds and new.stats.rounds != old.stats.rounds
    (cap,) = found["dspark.draft_budget.request_tokens"]
    assert cap.value == new.gamma  # the old engine's cap of 3 is gone with it
    (verify,) = found["dspark.step.verify_tokens"]
    assert verify.count == sum(1 for r in [*old_reports, *new_reports] if r.rounds)


def test_step_events_are_sampled_at_the_configured_rate(qwen3_dir, monkeypatch):
    engine, traced, spans, _, prompts = traced_engine(qwen3_dir, monkeypatch, rate="0.25")
    _, reports = run(engine, traced, prompts)
    indices = sorted({e.attributes[sc.STEP_INDEX] for s in spans.get_finished_spans() for e in s.events})
    assert indices == [r.index for r in reports][3::4]  # every fourth step, each on the spans it served


def test_nothing_configured_costs_the_engine_nothing(qwen3_dir, monkeypatch):
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_TRACES_EXPORTER", "DSPARK_PROMETHEUS_PORT"):
        monkeypatch.delenv(name, raising=False)
    telemetry = setup_telemetry("replica")
    assert not telemetry.tracing and not telemetry.metering
    prompts = prompts_of_mixed_length(384)[:1]
    engine = scheduled_engine(
        qwen3_dir, prompts, reference(qwen3_dir, prompts_of_mixed_length(384))[:1], "dspark"
    )
    traced = EngineTelemetry(telemetry, engine, "target", "r0")
    assert engine.step_observers == []
    trace = traced.start("e0", "label0", sc.TEXT_COMPLETION, GREEDY)
    engine.add_request(prompts[0], GREEDY, request_id="e0")
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                assert trace.finished(out) is None  # nothing for the ingress to copy


def test_a_failing_step_observer_is_dropped_and_the_engine_carries_on(qwen3_dir):
    prompts = prompts_of_mixed_length(384)[:2]
    expected = reference(qwen3_dir, prompts_of_mixed_length(384))[:2]
    engine = scheduled_engine(qwen3_dir, prompts, expected, "dspark")
    seen = []

    def broken(report):
        raise RuntimeError("telemetry bug")

    engine.step_observers += [broken, seen.append]
    results = {}
    for i, p in enumerate(prompts):
        engine.add_request(p, GREEDY, request_id=str(i))
    while engine.has_unfinished():
        results.update({o.request_id: o.token_ids for o in engine.step() if o.finished})
    assert [results[str(i)] for i in range(2)] == expected
    assert engine.step_observers == [seen.append] and len(seen) == engine.stats.steps
    # The reports add up to the engine's own counters.
    assert sum(r.verified_tokens for r in seen) == engine.stats.drafted_tokens
    assert sum(r.accepted_tokens for r in seen) == engine.stats.accepted_tokens
    assert sum(x.proposed for r in seen for x in r.rounds) == engine.stats.proposed_tokens
