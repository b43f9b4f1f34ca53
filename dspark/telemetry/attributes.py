"""Span attributes built from the engine's plain data (pure: no OpenTelemetry, no I/O).

The ingress and the replica name their request spans and fill them from these functions, so both
spans of one request carry the same values; the replica's speculation attributes travel to the
ingress on the last stream event and are copied there as they are.
"""

from __future__ import annotations

from dataclasses import dataclass

from dspark.draft_budget import DraftBudget
from dspark.outputs import RequestMetrics, RoundReport, SpeculationStats, StepReport
from dspark.sampling_params import SamplingParams
from dspark.telemetry import semconv as sc

Attributes = dict[str, str | bool | int | float | list[int] | list[str]]
DEFAULT_SLA_CLASS = "default"  # what a request without an SLA class is counted under


def span_name(operation: str, model: str) -> str:
    """`{gen_ai.operation.name} {gen_ai.request.model}`, as the GenAI conventions name inference spans."""
    return f"{operation} {model}"


def request_attributes(operation: str, model: str, params: SamplingParams | None = None) -> Attributes:
    """What is known when a request arrives: the operation, the model and how it is sampled."""
    attrs: Attributes = {
        sc.GEN_AI_OPERATION_NAME: operation,
        sc.GEN_AI_PROVIDER_NAME: sc.PROVIDER,
        sc.GEN_AI_REQUEST_MODEL: model,
    }
    if params is not None:
        attrs[sc.GEN_AI_REQUEST_MAX_TOKENS] = params.max_tokens
        attrs[sc.GEN_AI_REQUEST_TEMPERATURE] = params.temperature
        attrs[sc.GEN_AI_REQUEST_TOP_P] = params.top_p
        if params.top_k > 0:
            attrs[sc.GEN_AI_REQUEST_TOP_K] = params.top_k
        if params.seed is not None:
            attrs[sc.GEN_AI_REQUEST_SEED] = params.seed
        attrs[sc.SLA_CLASS] = params.sla_class or DEFAULT_SLA_CLASS
    return attrs


def metric_attributes(operation: str, model: str, sla_class: str | None) -> Attributes:
    """Attributes of the server latency metrics: what the conventions require, plus the SLA class."""
    return {**request_attributes(operation, model), sc.SLA_CLASS: sla_class or DEFAULT_SLA_CLASS}


def usage_attributes(finish_reason: str | None, input_tokens: int, output_tokens: int) -> Attributes:
    attrs: Attributes = {
        sc.GEN_AI_USAGE_INPUT_TOKENS: input_tokens,
        sc.GEN_AI_USAGE_OUTPUT_TOKENS: output_tokens,
    }
    if finish_reason:
        attrs[sc.GEN_AI_RESPONSE_FINISH_REASONS] = [finish_reason]
    return attrs


@dataclass(frozen=True)
class RequestTimings:
    """Seconds, each None when the request never got that far."""

    time_in_queue: float | None  # arrival to its first scheduled step
    time_to_first_token: float | None
    time_per_output_token: float | None  # after the first token; None with fewer than two tokens
    duration: float | None  # arrival to finish


def request_timings(arrival: float, metrics: RequestMetrics, output_tokens: int) -> RequestTimings:
    """Timings of a request that arrived at `arrival` (time.monotonic(), e.g. when the replica got it;
    at most the engine's own arrival time) from the engine's timestamps."""

    def since(start: float | None, end: float | None) -> float | None:
        return None if start is None or end is None else max(0.0, end - start)

    tpot = None
    if output_tokens > 1 and metrics.first_token_time is not None and metrics.finished_time is not None:
        tpot = max(0.0, metrics.finished_time - metrics.first_token_time) / (output_tokens - 1)
    return RequestTimings(
        since(arrival, metrics.first_scheduled_time),
        since(arrival, metrics.first_token_time),
        tpot,
        since(arrival, metrics.finished_time),
    )


def speculation_attributes(
    spec: SpeculationStats,
    *,
    drafter: str,
    block_length: int,
    budget: DraftBudget,
    sla_class: str | None,
    timings: RequestTimings,
) -> Attributes:
    """The `dspark.*` attributes of a finished request."""
    by_position = list(spec.accepted_by_position[:block_length])
    by_position += [0] * (block_length - len(by_position))
    request_cap = budget.request_cap(sla_class)
    attrs: Attributes = {
        sc.DRAFTER: drafter,
        sc.BLOCK_LENGTH: block_length,
        sc.ROUNDS: spec.rounds,
        sc.DRAFTED_TOKENS: spec.proposed_tokens,
        sc.VERIFIED_TOKENS: spec.drafted_tokens,
        sc.ACCEPTED_TOKENS: spec.accepted_tokens,
        sc.MEAN_ACCEPT_LENGTH: spec.mean_accept_length,
        sc.ACCEPTED_BY_POSITION: by_position,
        sc.REQUEST_CAP: block_length if request_cap is None else min(block_length, request_cap),
        sc.SLA_CLASS: sla_class or DEFAULT_SLA_CLASS,
    }
    if budget.max_step_tokens is not None:
        attrs[sc.BUDGET_MAX_STEP_TOKENS] = budget.max_step_tokens
    if budget.max_request_tokens is not None:
        attrs[sc.BUDGET_MAX_REQUEST_TOKENS] = budget.max_request_tokens
    for name, value in (
        (sc.TIME_IN_QUEUE, timings.time_in_queue),
        (sc.TIME_TO_FIRST_TOKEN, timings.time_to_first_token),
        (sc.TIME_PER_OUTPUT_TOKEN, timings.time_per_output_token),
    ):
        if value is not None:
            attrs[name] = value
    return attrs


def step_attributes(report: StepReport) -> Attributes:
    """What one engine step did, shared by the events it leaves on every request it served."""
    attrs: Attributes = {
        sc.STEP_INDEX: report.index,
        sc.STEP_BATCH_SIZE: report.batch_size,
        sc.STEP_DECODING: len(report.rounds),
        sc.STEP_NUM_TOKENS: report.num_tokens,
        sc.STEP_VERIFIED_TOKENS: report.verified_tokens,
        sc.STEP_ACCEPTED_TOKENS: report.accepted_tokens,
        sc.STEP_DRAFTING: report.drafting,
        sc.STEP_SCHEDULER: report.scheduler,
        sc.STEP_MEASURED_FORWARD: report.forward_s,
        sc.STEP_DURATION: report.duration_s,
    }
    if report.predicted_forward_s is not None:
        attrs[sc.STEP_PREDICTED_FORWARD] = report.predicted_forward_s
    return attrs


def round_attributes(round_: RoundReport) -> Attributes:
    """One request's share of a step, added to the step's attributes on that request's event."""
    attrs: Attributes = {sc.STEP_REQUEST_PROPOSED: round_.proposed, sc.STEP_REQUEST_VERIFIED: round_.verified}
    if round_.accepted is not None:
        attrs[sc.STEP_REQUEST_ACCEPTED] = round_.accepted
    return attrs


def error_type(exc: BaseException) -> str:
    """`error.type`: the exception's class name, a low-cardinality value as the conventions ask."""
    return type(exc).__name__
