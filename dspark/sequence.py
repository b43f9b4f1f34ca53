"""One request's state inside the engine."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

import torch

from dspark.detokenizer import IncrementalDetokenizer
from dspark.sampling_params import SamplingParams


class Status(enum.Enum):
    PREFILL = "prefill"
    DECODE = "decode"
    FINISHED = "finished"


@dataclass
class Sequence:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    detokenizer: IncrementalDetokenizer
    generator: torch.Generator | None
    output_token_ids: list[int] = field(default_factory=list)
    num_computed: int = 0  # tokens whose K/V are committed in the cache
    num_cached_tokens: int = 0  # prompt tokens whose K/V came from the prefix cache (not computed)
    # Hidden states of prompt tokens computed since the last full page, until the prefix cache takes
    # their page (engine._publish).
    unsettled_hidden: list[torch.Tensor] = field(default_factory=list)
    status: Status = Status.PREFILL
    finish_reason: str | None = None
    error: Exception | None = None  # why the engine stopped it, when finish_reason is "error"
    text: str = ""
    arrival_time: float = field(default_factory=time.monotonic)
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None
    # Speculation counters: rounds with a verify, drafted tokens proposed, those put to the target,
    # accepted ones, and [i]: rounds that accepted at least i + 1 drafted tokens.
    rounds: int = 0
    proposed_draft_tokens: int = 0
    verified_draft_tokens: int = 0
    accepted_draft_tokens: int = 0
    accepted_by_position: list[int] = field(default_factory=list)
    # What the last step emitted, for streaming.
    delta_token_ids: list[int] = field(default_factory=list)
    delta_text: str = ""

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def remaining_tokens(self) -> int:
        return self.params.max_tokens - len(self.output_token_ids)

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED

    @property
    def mean_accept_length(self) -> float:
        """tau: tokens gained per verify round, the bonus/correction token included."""
        return (self.accepted_draft_tokens + self.rounds) / self.rounds if self.rounds else 0.0
