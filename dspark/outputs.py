"""What the engine hands back: cumulative results plus the delta of the last step (for streaming), and
per-step reports for observers (telemetry) that must not reach into the step loop."""

from __future__ import annotations

from dataclasses import dataclass

from dspark.sequence import Sequence


@dataclass(frozen=True)
class SpeculationStats:
    rounds: int
    drafted_tokens: int  # drafted tokens put to the target for verification
    accepted_tokens: int
    mean_accept_length: float  # tau, bonus token included
    proposed_tokens: int = 0  # drafted by the drafter; the verify-length policy may verify fewer
    # [i]: rounds that accepted at least i + 1 drafted tokens (vLLM's accepted tokens per position)
    accepted_by_position: tuple[int, ...] = ()

    def to_dict(self) -> dict:
        return {
            "rounds": self.rounds,
            "drafted_tokens": self.drafted_tokens,
            "accepted_tokens": self.accepted_tokens,
            "mean_accept_length": round(self.mean_accept_length, 4),
            "proposed_tokens": self.proposed_tokens,
            "accepted_by_position": list(self.accepted_by_position),
        }


@dataclass(frozen=True)
class RequestMetrics:
    """When things happened to a request, in time.monotonic() seconds (None: not yet)."""

    arrival_time: float  # admitted by the engine
    first_scheduled_time: float | None  # its first prompt chunk ran
    first_token_time: float | None
    finished_time: float | None


@dataclass(frozen=True)
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int]  # generated ids only
    delta_text: str
    delta_token_ids: list[int]
    finished: bool
    finish_reason: str | None  # "stop" | "length" | "abort" | "error"
    speculation: SpeculationStats
    error: Exception | None = None  # a RequestFailedError when finish_reason is "error"
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache (vLLM's num_cached_tokens)
    metrics: RequestMetrics | None = None

    @staticmethod
    def of(seq: Sequence) -> RequestOutput:
        return RequestOutput(
            request_id=seq.request_id,
            prompt=seq.prompt,
            prompt_token_ids=seq.prompt_token_ids,
            text=seq.text,
            token_ids=list(seq.output_token_ids),
            delta_text=seq.delta_text,
            delta_token_ids=list(seq.delta_token_ids),
            finished=seq.finished,
            finish_reason=seq.finish_reason,
            speculation=SpeculationStats(
                seq.rounds,
                seq.verified_draft_tokens,
                seq.accepted_draft_tokens,
                seq.mean_accept_length,
                seq.proposed_draft_tokens,
                tuple(seq.accepted_by_position),
            ),
            error=seq.error,
            num_cached_tokens=seq.num_cached_tokens,
            metrics=RequestMetrics(
                seq.arrival_time, seq.first_scheduled_time, seq.first_token_time, seq.finished_time
            ),
        )


@dataclass(frozen=True)
class RoundReport:
    """One decoding request's share of a step."""

    request_id: str
    proposed: int  # drafted tokens the drafter proposed
    verified: int  # of those, put to the target (the verify-length policy's choice)
    accepted: int | None  # None: the request failed in its own share of the step
    survival: list[float] | None  # prefix survival the drafter's confidences predicted; None without


@dataclass(frozen=True)
class StepReport:
    """What one engine step did, handed to `Engine.step_observers` after the step."""

    index: int  # steps so far, this one included
    rounds: tuple[RoundReport, ...]  # the decoding requests, in arrival order
    prefill_request_ids: tuple[str, ...]  # requests whose prompt chunk ran this step
    num_tokens: int  # tokens in the forward
    drafting: bool  # False when the draft gate skipped drafting
    scheduler: str  # the verify-length policy (EngineConfig.scheduler)
    predicted_forward_s: float | None  # 1 / SPS(num_tokens) from the cost table, before this step
    forward_s: float
    draft_s: float
    duration_s: float

    @property
    def batch_size(self) -> int:
        return len(self.rounds) + len(self.prefill_request_ids)

    @property
    def verified_tokens(self) -> int:
        return sum(r.verified for r in self.rounds)

    @property
    def accepted_tokens(self) -> int:
        return sum(r.accepted or 0 for r in self.rounds)
