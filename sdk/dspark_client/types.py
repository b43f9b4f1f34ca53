"""Typed results, and the one function that builds a GenerateRequest for both clients."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

from dspark_client.proto import pb


@dataclass(frozen=True)
class Delta:
    """New output since the previous delta."""

    text: str
    token_ids: tuple[int, ...]


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    cached_tokens: int = 0  # prompt tokens the server's prefix cache supplied


@dataclass(frozen=True)
class SpeculationStats:
    rounds: int
    drafted_tokens: int
    accepted_tokens: int
    mean_accept_length: float  # tau: tokens gained per verify round, bonus token included


@dataclass(frozen=True)
class Completion:
    request_id: str
    text: str
    token_ids: tuple[int, ...]
    finish_reason: str  # "stop" | "length" | "abort"
    usage: Usage
    speculation: SpeculationStats


@dataclass(frozen=True)
class ModelInfo:
    model: str
    max_model_len: int
    vocab_size: int
    drafter: str
    num_speculative_tokens: int
    tensor_parallel_size: int
    num_replicas: int


@dataclass(frozen=True)
class ReplicaLoad:
    replica_id: str
    running_requests: int
    queued_requests: int
    queued_prefill_tokens: int
    kv_unreserved_pages: int
    kv_total_pages: int
    kv_headroom: float
    recent_tau: float
    draft_budget_json: str
    healthy: bool


def build_request(
    prompt: str | None = None,
    *,
    prompt_token_ids: Sequence[int] | None = None,
    model: str = "",
    request_id: str | None = None,
    sla_class: str = "",
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    max_tokens: int | None = None,
    stop: str | Sequence[str] = (),
    stop_token_ids: Sequence[int] = (),
    ignore_eos: bool = False,
    seed: int | None = None,
    include_stop_str_in_output: bool = False,
) -> pb.GenerateRequest:
    """A request with a fresh request_id unless one is given; the server validates the values."""
    sampling = pb.SamplingOptions(
        stop=[stop] if isinstance(stop, str) else list(stop),
        stop_token_ids=list(stop_token_ids),
        ignore_eos=ignore_eos,
        include_stop_str_in_output=include_stop_str_in_output,
    )
    for name, value in (
        ("temperature", temperature),
        ("top_p", top_p),
        ("top_k", top_k),
        ("max_tokens", max_tokens),
        ("seed", seed),
    ):
        if value is not None:
            setattr(sampling, name, value)
    return pb.GenerateRequest(
        request_id=request_id or uuid.uuid4().hex,
        model=model,
        prompt=prompt or "",
        prompt_token_ids=list(prompt_token_ids or ()),
        sampling=sampling,
        sla_class=sla_class,
    )


@dataclass
class CompletionBuilder:
    """Accumulates a Generate stream into deltas and, at its final message, a Completion."""

    request_id: str
    text: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    completion: Completion | None = None

    def add(self, response: pb.GenerateResponse) -> Delta | None:
        """The Delta this message carries, or None for the final message (which sets `completion`)."""
        if response.HasField("final"):
            final = response.final
            u, s = final.usage, final.speculation
            self.completion = Completion(
                request_id=self.request_id,
                text="".join(self.text),
                token_ids=tuple(self.token_ids),
                finish_reason=final.finish_reason,
                usage=Usage(u.prompt_tokens, u.completion_tokens, u.total_tokens, u.cached_tokens),
                speculation=SpeculationStats(
                    s.rounds, s.drafted_tokens, s.accepted_tokens, s.mean_accept_length
                ),
            )
            return None
        delta = Delta(response.delta.text, tuple(response.delta.token_ids))
        self.text.append(delta.text)
        self.token_ids.extend(delta.token_ids)
        return delta


def model_info_of(msg: pb.ModelInfo) -> ModelInfo:
    return ModelInfo(
        msg.model,
        msg.max_model_len,
        msg.vocab_size,
        msg.drafter,
        msg.num_speculative_tokens,
        msg.tensor_parallel_size,
        msg.num_replicas,
    )


def loads_of(msg: pb.GetLoadsResponse) -> list[ReplicaLoad]:
    return [
        ReplicaLoad(
            r.replica_id,
            r.running_requests,
            r.queued_requests,
            r.queued_prefill_tokens,
            r.kv_unreserved_pages,
            r.kv_total_pages,
            r.kv_headroom,
            r.recent_tau,
            r.draft_budget_json,
            r.healthy,
        )
        for r in msg.replicas
    ]
