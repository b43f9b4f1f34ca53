"""Engine-wide counters and step timings."""

from __future__ import annotations

import math
from collections import Counter, deque
from dataclasses import dataclass, field

from dspark.draft_budget import DraftBudget
from dspark.draft_gate import DraftGate


@dataclass
class EngineStats:
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0  # prompt tokens whose K/V came from the prefix cache
    prefill_tokens: int = 0  # prompt tokens the target ran (the rest were cached)
    prompt_chunks: int = 0  # prompt chunks the target ran (a request's prompt in one or more steps)
    forward_tokens: int = 0  # tokens through target forwards: prefill, anchors and verified drafts
    # The forwards' padded attention (dspark/attention.py pads every request to the longest): each
    # forward's requests times its longest context (new tokens included), and that times the most new
    # tokens a request ran (the query-key pairs scored), summed. A step's forward grows with them beside
    # its tokens: the simulator's profile prices them (sim/attention.py).
    attention_keys: int = 0
    attention_query_keys: int = 0
    generated_tokens: int = 0
    steps: int = 0
    rounds: int = 0  # verify rounds summed over requests
    drafted_tokens: int = 0  # put to the target for verification
    accepted_tokens: int = 0
    proposed_tokens: int = 0  # drafted by the drafter (the policy may verify fewer)
    accepted_by_position: list[int] = field(default_factory=list)  # as Sequence.accepted_by_position
    finished_requests: int = 0
    aborted_requests: int = 0
    gated_rounds: int = 0  # steps whose drafting the draft gate skipped
    failed_requests: int = 0  # stopped by an error in their own share of a step (request_failure.py)
    drafter_failures: int = 0  # drafter faults that cost a round of drafting (drafter_guard.py)
    step_time_s: float = 0.0
    forward_time_s: float = 0.0
    draft_time_s: float = 0.0
    recent_step_ms: deque = field(default_factory=lambda: deque(maxlen=256))
    # A step as its decoding requests live it, summed over their rounds (each step adds its decoding
    # requests times): its wall time, from the previous step's end when requests were waiting (the
    # serving loop's time between steps included), and its decode tokens (anchors and verified drafts).
    # Over a window, round_time_s / rounds is the wall of a step a decoding request waits per round:
    # what its time per output token is made of (the router calibrates by it, router/signals.py).
    round_time_s: float = 0.0
    round_tokens: int = 0
    # The steps that ran a prompt chunk, apart (their part of steps, step_time_s, forward_tokens, rounds
    # and draft_time_s): a run's mean step hides two kinds, decode steps of a few tokens and prefill steps
    # of many, which a cost model fitted to run means cannot tell apart (sim/step_fit.py splits them).
    prefill_steps: int = 0
    prefill_step_time_s: float = 0.0
    prefill_step_forward_tokens: int = 0
    prefill_step_attention_keys: int = 0
    prefill_step_attention_query_keys: int = 0
    prefill_step_rounds: int = 0
    prefill_step_draft_time_s: float = 0.0
    # The verify-length scheduler: its budget, the lengths it chose (l -> request-rounds), and in
    # rounds with confidences the accepted drafts it expected (sum of survival) against those accepted.
    draft_budget: DraftBudget = field(default_factory=DraftBudget)
    # The draft gate (scheduled modes), whose state says why rounds were gated: what it measured drafting
    # to gain and cost, and when it probes next. None: no gate.
    draft_gate: DraftGate | None = None
    verify_lengths: Counter = field(default_factory=Counter)
    predicted_accepted_tokens: float = 0.0
    realised_accepted_tokens: int = 0

    def record_step(self, elapsed_s: float, forward_s: float, draft_s: float) -> None:
        self.steps += 1
        self.step_time_s += elapsed_s
        self.forward_time_s += forward_s
        self.draft_time_s += draft_s
        self.recent_step_ms.append(elapsed_s * 1e3)

    def record_prefill_step(
        self,
        elapsed_s: float,
        forward_tokens: int,
        rounds: int,
        draft_s: float,
        attention_keys: int = 0,
        attention_query_keys: int = 0,
    ) -> None:
        """The step just recorded (record_step) ran a prompt chunk: its part in the prefill steps."""
        self.prefill_steps += 1
        self.prefill_step_time_s += elapsed_s
        self.prefill_step_forward_tokens += forward_tokens
        self.prefill_step_attention_keys += attention_keys
        self.prefill_step_attention_query_keys += attention_query_keys
        self.prefill_step_rounds += rounds
        self.prefill_step_draft_time_s += draft_s

    def record_decode(self, decoding: int, decode_tokens: int, wall_s: float) -> None:
        """A step of `decoding` requests, `decode_tokens` of its forward theirs, `wall_s` long as they
        waited for it (the step and the serving loop's time before it)."""
        self.round_time_s += decoding * wall_s
        self.round_tokens += decoding * decode_tokens

    def record_verdict(self, proposed: int, verified: int, accepted: int) -> None:
        """One request's verify round in the speculation counters."""
        self.rounds += 1
        self.proposed_tokens += proposed
        self.drafted_tokens += verified
        self.accepted_tokens += accepted
        count_positions(self.accepted_by_position, accepted)

    def record_round(self, verified: int, survival: list[float] | None, accepted: int) -> None:
        """One request's verify round: `verified` drafted tokens checked, `accepted` of them kept."""
        self.verify_lengths[verified] += 1
        if survival is not None:
            self.predicted_accepted_tokens += math.fsum(survival[:verified])
            self.realised_accepted_tokens += accepted

    @property
    def mean_accept_length(self) -> float:
        return (self.accepted_tokens + self.rounds) / self.rounds if self.rounds else 0.0

    @property
    def verify_length_hist(self) -> list[int]:
        """Request-rounds by verified drafted tokens: entry l counts rounds that verified l."""
        return [self.verify_lengths[n] for n in range(max(self.verify_lengths, default=-1) + 1)]

    @property
    def overhead_fraction(self) -> float:
        """Share of step time outside the target forward and the drafter: the engine's own cost."""
        if self.step_time_s == 0:
            return 0.0
        return (self.step_time_s - self.forward_time_s - self.draft_time_s) / self.step_time_s

    def to_dict(self) -> dict:
        recent = sorted(self.recent_step_ms)
        return {
            "prompt_tokens": self.prompt_tokens,
            "cached_prompt_tokens": self.cached_prompt_tokens,
            "prefix_cache_hit_rate": round(self.cached_prompt_tokens / self.prompt_tokens, 4)
            if self.prompt_tokens
            else 0.0,
            "prefill_tokens": self.prefill_tokens,
            "prompt_chunks": self.prompt_chunks,
            "forward_tokens": self.forward_tokens,
            "attention_keys": self.attention_keys,
            "attention_query_keys": self.attention_query_keys,
            "generated_tokens": self.generated_tokens,
            "steps": self.steps,
            "rounds": self.rounds,
            "drafted_tokens": self.drafted_tokens,
            "accepted_tokens": self.accepted_tokens,
            "proposed_tokens": self.proposed_tokens,
            "accepted_by_position": list(self.accepted_by_position),
            "mean_accept_length": round(self.mean_accept_length, 4),
            "acceptance_rate": round(self.accepted_tokens / self.drafted_tokens, 4)
            if self.drafted_tokens
            else 0.0,
            "finished_requests": self.finished_requests,
            "aborted_requests": self.aborted_requests,
            "gated_rounds": self.gated_rounds,
            "draft_gate": self.draft_gate.to_dict() if self.draft_gate is not None else None,
            "failed_requests": self.failed_requests,
            "drafter_failures": self.drafter_failures,
            "step_time_s": round(self.step_time_s, 4),
            "round_time_s": round(self.round_time_s, 4),
            "round_tokens": self.round_tokens,
            "prefill_steps": self.prefill_steps,
            "prefill_step_time_s": round(self.prefill_step_time_s, 4),
            "prefill_step_forward_tokens": self.prefill_step_forward_tokens,
            "prefill_step_attention_keys": self.prefill_step_attention_keys,
            "prefill_step_attention_query_keys": self.prefill_step_attention_query_keys,
            "prefill_step_rounds": self.prefill_step_rounds,
            "prefill_step_draft_time_s": round(self.prefill_step_draft_time_s, 4),
            "forward_time_s": round(self.forward_time_s, 4),
            "draft_time_s": round(self.draft_time_s, 4),
            "overhead_fraction": round(self.overhead_fraction, 4),
            "step_ms_p50": round(recent[len(recent) // 2], 3) if recent else 0.0,
            "draft_budget": self.draft_budget.to_dict(),
            "mean_verify_tokens": round(self.drafted_tokens / self.rounds, 4) if self.rounds else 0.0,
            "verify_length_hist": self.verify_length_hist,
            "predicted_accepted_tokens": round(self.predicted_accepted_tokens, 4),
            "realised_accepted_tokens": self.realised_accepted_tokens,
        }


def count_positions(counts: list[int], accepted: int) -> None:
    """counts[i] += 1 for every position i < accepted, growing `counts` as needed."""
    if len(counts) < accepted:
        counts.extend([0] * (accepted - len(counts)))
    for i in range(accepted):
        counts[i] += 1
