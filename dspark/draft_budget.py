"""DraftBudget: the runtime control on how many drafted tokens the target verifies.

Anchors are never counted: every running request always runs its last token, so a budget of 0
means plain decoding. `max_step_s` limits a step's predicted time (its cost table's), which bounds the
prefill it carries beside the decoding requests (dspark/step_budget.py); the cluster controller sets it
from the tightest TPOT target among the SLA classes running there. The engine reads its budget at the
start of every step, so a new one takes effect on the next step while requests keep running
(`Engine.set_draft_budget`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from dspark.errors import InvalidRequestError


@dataclass(frozen=True)
class DraftBudget:
    """Limits on verified drafted tokens; None means no limit beyond the engine's own."""

    max_step_tokens: int | None = None  # per step, summed over the batch
    max_request_tokens: int | None = None  # per request per round
    # SamplingParams.sla_class -> per-request limit for that class (overrides max_request_tokens).
    max_request_tokens_by_class: Mapping[str, int] = field(default_factory=dict)
    # Seconds a step may take (predicted by the cost table): bounds its prefill tokens.
    max_step_s: float | None = None

    def __post_init__(self) -> None:
        step_s = self.max_step_s
        if step_s is not None and (
            isinstance(step_s, bool) or not isinstance(step_s, int | float) or not 0 < step_s < float("inf")
        ):
            raise InvalidRequestError("max_step_s", f"must be seconds > 0 or None, got {step_s!r}")
        object.__setattr__(self, "max_request_tokens_by_class", dict(self.max_request_tokens_by_class))
        limits = {"max_step_tokens": self.max_step_tokens, "max_request_tokens": self.max_request_tokens}
        limits.update(
            {f"max_request_tokens_by_class[{k!r}]": v for k, v in self.max_request_tokens_by_class.items()}
        )
        for name, value in limits.items():
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise InvalidRequestError(name, f"must be an integer >= 0 or None, got {value!r}")
        if not all(isinstance(k, str) for k in self.max_request_tokens_by_class):
            raise InvalidRequestError("max_request_tokens_by_class", "SLA class names must be strings")

    @staticmethod
    def from_dict(budget: Mapping) -> DraftBudget:
        """A budget as the admin API sends it (JSON); an unknown field is refused by name."""
        known = {"max_step_tokens", "max_request_tokens", "max_request_tokens_by_class", "max_step_s"}
        if unknown := sorted(set(budget) - known):
            raise InvalidRequestError(unknown[0], f"unknown field; known: {sorted(known)}")
        return DraftBudget(**budget)

    @property
    def unlimited(self) -> bool:
        """No limit beyond the engine's own."""
        return self == DraftBudget()

    def request_cap(self, sla_class: str | None) -> int | None:
        """The most drafted tokens one request of this SLA class may verify per round."""
        return self.max_request_tokens_by_class.get(sla_class, self.max_request_tokens)

    def to_dict(self) -> dict:
        return {
            "max_step_tokens": self.max_step_tokens,
            "max_request_tokens": self.max_request_tokens,
            "max_request_tokens_by_class": dict(self.max_request_tokens_by_class),
            "max_step_s": self.max_step_s,
        }
