"""What the engine hands back: cumulative results plus the delta of the last step (for streaming)."""

from __future__ import annotations

from dataclasses import dataclass

from dspark.sequence import Sequence


@dataclass(frozen=True)
class SpeculationStats:
    rounds: int
    drafted_tokens: int  # drafted tokens put to the target for verification
    accepted_tokens: int
    mean_accept_length: float  # tau, bonus token included

    def to_dict(self) -> dict:
        return {
            "rounds": self.rounds,
            "drafted_tokens": self.drafted_tokens,
            "accepted_tokens": self.accepted_tokens,
            "mean_accept_length": round(self.mean_accept_length, 4),
        }


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
                seq.rounds, seq.verified_draft_tokens, seq.accepted_draft_tokens, seq.mean_accept_length
            ),
            error=seq.error,
            num_cached_tokens=seq.num_cached_tokens,
        )
