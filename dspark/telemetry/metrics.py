"""Every metric a replica exports, defined once (`INSTRUMENTS`), and the meter-side glue that feeds them.

Latency histograms are recorded once per finished request and the verify-tokens histogram once per
step; every counter and gauge is observable: the SDK reads the engine's cumulative counters, budget
and cost table when it collects (every export interval, or a Prometheus scrape), so the step loop
pays nothing for them. The speculation counters mirror vLLM's spec-decode counters (same meaning,
same `position` label); their Prometheus names are vLLM's with our namespace (dspark/telemetry/prometheus.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from dspark.outputs import StepReport
from dspark.telemetry import semconv as sc
from dspark.telemetry.attributes import DEFAULT_SLA_CLASS, Attributes, RequestTimings
from dspark.telemetry.calibration import CalibrationWindow

VERIFY_TOKEN_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


@dataclass(frozen=True)
class Instrument:
    name: str
    kind: str  # "histogram" | "counter" | "gauge"
    unit: str
    description: str
    buckets: tuple[float, ...] | None = None


TTFT = Instrument(
    sc.TTFT, "histogram", "s", "Time to generate first token for successful responses.", sc.TTFT_BUCKETS
)
TPOT = Instrument(
    sc.TPOT,
    "histogram",
    "s",
    "Time per output token generated after the first token for successful responses.",
    sc.TPOT_BUCKETS,
)
REQUEST_DURATION = Instrument(
    sc.REQUEST_DURATION,
    "histogram",
    "s",
    "Generative AI server request duration such as time-to-last byte or last output token.",
    sc.DURATION_BUCKETS,
)
NUM_DRAFTS = Instrument(
    "dspark.spec_decode.num_drafts",
    "counter",
    "{draft}",
    "Verify rounds: one per decoding request per step (tau = 1 + accepted / rounds).",
)
NUM_DRAFT_TOKENS = Instrument(
    "dspark.spec_decode.num_draft_tokens", "counter", "{token}", "Drafted tokens put to the target to verify."
)
NUM_ACCEPTED_TOKENS = Instrument(
    "dspark.spec_decode.num_accepted_tokens", "counter", "{token}", "Drafted tokens the target accepted."
)
NUM_ACCEPTED_TOKENS_PER_POS = Instrument(
    "dspark.spec_decode.num_accepted_tokens_per_pos",
    "counter",
    "{token}",
    "Rounds that accepted the drafted token at this position (and so every one before it).",
)
NUM_PROPOSED_TOKENS = Instrument(
    "dspark.spec_decode.num_proposed_tokens",
    "counter",
    "{token}",
    "Tokens the drafter proposed (the verify-length policy may verify fewer).",
)
STEP_VERIFY_TOKENS = Instrument(
    "dspark.step.verify_tokens",
    "histogram",
    "{token}",
    "Drafted tokens verified per engine step, whole batch.",
    VERIFY_TOKEN_BUCKETS,
)
BUDGET_STEP_TOKENS = Instrument(
    "dspark.draft_budget.step_tokens",
    "gauge",
    "{token}",
    "Most drafted tokens verified per step: the draft budget, or the engine's token limit.",
)
BUDGET_REQUEST_TOKENS = Instrument(
    "dspark.draft_budget.request_tokens",
    "gauge",
    "{token}",
    "Most drafted tokens one request of this SLA class verifies per round, budget applied.",
)
SPS_PROFILED = Instrument(
    "dspark.sps.profiled", "gauge", "{step}/s", "Verify steps per second at this batch size, as profiled."
)
SPS_MEASURED = Instrument(
    "dspark.sps.measured",
    "gauge",
    "{step}/s",
    "Verify steps per second at this batch size, as measured online.",
)
CALIBRATION_ERROR = Instrument(
    "dspark.confidence.calibration_error",
    "gauge",
    "1",
    "Expected calibration error of drafted-token confidences against acceptance, recent rounds.",
)

INSTRUMENTS: tuple[Instrument, ...] = (
    TTFT,
    TPOT,
    REQUEST_DURATION,
    NUM_DRAFTS,
    NUM_DRAFT_TOKENS,
    NUM_ACCEPTED_TOKENS,
    NUM_ACCEPTED_TOKENS_PER_POS,
    NUM_PROPOSED_TOKENS,
    STEP_VERIFY_TOKENS,
    BUDGET_STEP_TOKENS,
    BUDGET_REQUEST_TOKENS,
    SPS_PROFILED,
    SPS_MEASURED,
    CALIBRATION_ERROR,
)


class EngineMetrics:
    """The instruments of one replica, fed from its engine (`engine` is a dspark.engine.Engine)."""

    def __init__(self, meter: Meter, engine, model: str, replica_id: str) -> None:
        self.engine = engine
        self.calibration = CalibrationWindow()
        self._spec_attrs = {"model_name": model}  # vLLM's label on its spec-decode counters
        self._replica_attrs = {sc.REPLICA_ID: replica_id}
        self._step_attrs = {sc.GEN_AI_REQUEST_MODEL: model}
        self.ttft = _histogram(meter, TTFT)
        self.tpot = _histogram(meter, TPOT)
        self.duration = _histogram(meter, REQUEST_DURATION)
        self.verify_tokens = _histogram(meter, STEP_VERIFY_TOKENS)
        stats = lambda: self.engine.stats  # noqa: E731  (read at collection time; attach may replace it)
        _observable(meter, NUM_DRAFTS, lambda: self._one(stats().rounds))
        _observable(meter, NUM_DRAFT_TOKENS, lambda: self._one(stats().drafted_tokens))
        _observable(meter, NUM_ACCEPTED_TOKENS, lambda: self._one(stats().accepted_tokens))
        _observable(meter, NUM_PROPOSED_TOKENS, lambda: self._one(stats().proposed_tokens))
        _observable(meter, NUM_ACCEPTED_TOKENS_PER_POS, self._per_position)
        _observable(meter, BUDGET_STEP_TOKENS, self._step_budget)
        _observable(meter, BUDGET_REQUEST_TOKENS, self._request_budget)
        _observable(meter, SPS_PROFILED, lambda: self._sps("profiled"))
        _observable(meter, SPS_MEASURED, lambda: self._sps("rates"))
        _observable(meter, CALIBRATION_ERROR, self._calibration_error)

    def attach(self, engine) -> None:
        """Read a new engine from now on; its counters start again from zero (a counter reset, as after a
        restart), and the calibration window starts empty (the drafter may differ)."""
        self.engine = engine
        self.calibration = CalibrationWindow()

    # ---- recorded -------------------------------------------------------------------------------------

    def record_request(self, attrs: Attributes, timings: RequestTimings, error: str | None) -> None:
        """A finished request; `attrs` are its metric attributes (operation, provider, model, SLA class).
        TTFT and TPOT count successful responses only, as the conventions define them."""
        if error is None:
            if timings.time_to_first_token is not None:
                self.ttft.record(timings.time_to_first_token, attrs)
            if timings.time_per_output_token is not None:
                self.tpot.record(timings.time_per_output_token, attrs)
        if timings.duration is not None:
            self.duration.record(
                timings.duration, attrs if error is None else {**attrs, sc.ERROR_TYPE: error}
            )

    def record_step(self, report: StepReport) -> None:
        """Engine thread: one step's verify tokens, and its rounds' confidences for calibration."""
        if not report.rounds:
            return
        self.verify_tokens.record(report.verified_tokens, self._step_attrs)
        for r in report.rounds:
            if r.survival and r.accepted is not None and r.verified:
                self.calibration.add(r.survival[: r.verified], r.accepted)

    # ---- observed -------------------------------------------------------------------------------------

    def _one(self, value: int) -> list[Observation]:
        return [Observation(value, self._spec_attrs)]

    def _per_position(self) -> list[Observation]:
        counts = list(self.engine.stats.accepted_by_position)
        counts += [0] * (self.engine.gamma - len(counts))
        return [Observation(n, {**self._spec_attrs, "position": str(i)}) for i, n in enumerate(counts)]

    def _step_budget(self) -> list[Observation]:
        engine = self.engine
        limit = engine.config.max_num_batched_tokens
        budget = engine.draft_budget.max_step_tokens
        return [Observation(limit if budget is None else min(limit, budget), self._replica_attrs)]

    def _request_budget(self) -> list[Observation]:
        budget, gamma = self.engine.draft_budget, self.engine.gamma
        classes = [None, *budget.max_request_tokens_by_class]
        caps = {c: budget.request_cap(c) for c in classes}
        return [
            Observation(
                gamma if cap is None else min(gamma, cap),
                {**self._replica_attrs, sc.SLA_CLASS: c or DEFAULT_SLA_CLASS},
            )
            for c, cap in caps.items()
        ]

    def _sps(self, which: str) -> list[Observation]:
        table = self.engine.cost_table
        if table is None:
            return []
        rates = getattr(table, which)
        return [
            Observation(rate, {**self._replica_attrs, "dspark.batch_tokens": point})
            for point, rate in zip(table.points, rates)
        ]

    def _calibration_error(self) -> list[Observation]:
        error = self.calibration.error()
        return [] if error is None else [Observation(error, self._replica_attrs)]


def _histogram(meter: Meter, spec: Instrument):
    return meter.create_histogram(
        spec.name,
        unit=spec.unit,
        description=spec.description,
        explicit_bucket_boundaries_advisory=list(spec.buckets or ()),
    )


def _observable(meter: Meter, spec: Instrument, read) -> None:
    def callback(options: CallbackOptions) -> Iterable[Observation]:
        return read()

    create = meter.create_observable_counter if spec.kind == "counter" else meter.create_observable_gauge
    create(spec.name, callbacks=[callback], unit=spec.unit, description=spec.description)
