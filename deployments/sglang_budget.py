"""The controller's draft budget as SGLang's one runtime knob, or a refusal that says why.

SGLang 0.5.23 moves DSpark's verify budget at runtime only through `set_internal_state` with
`dspark_force_budget_frac` (scheduler_components/internal_state.py -> DSparkWorkerV2 -> the planner's
HostConfidenceBudgetPlanner). Its meaning differs from our DraftBudget's, so the mapping is narrow:

- SGLang's frac is an OVERRIDE: every step verifies exactly int(frac * running requests * gamma) drafted
  tokens, handed to the most confident drafts across the batch, in place of its SPS-optimal choice. Ours
  are CAPS, so what SGLang applies is a budget per running request, reported as that mean:
  `max_request_tokens = k` (0 < k < gamma) is frac = k / gamma; `max_step_tokens = K` is K tokens at the
  n requests running when it arrives, frac = K / (n * gamma), which SGLang then scales with the batch.
  That is the reading the controller's model supports (controller/model.py): the budget per request is
  what moves smoothly and never rises with load, and the controller re-sends it when its target moves.
  Both given: the smaller per step. A budget of the whole batch or more limits nothing: the override is
  cleared (SGLang's own SPS-optimal budget).
- Refused, by field and with a reason code (`Refusal`): `max_request_tokens_by_class` (one budget for
  the whole batch, no SLA classes), a cap of 0 (frac must be in (0, 1]: plain decoding, i.e. drafting
  off, is not reachable at runtime), `max_step_s` (SGLang's prefill chunk, chunked_prefill_size, is a
  launch argument with no runtime setter), and anything but "no limit" where SGLang verifies every drafted
  token and accepts the knob as a no-op: static mode, and compact mode without a profiled SPS table
  (dspark_planner.py: a missing or flat table makes its planner verify-all). `split` applies the rest.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from dspark.draft_budget import DraftBudget
from dspark.errors import InvalidRequestError

KNOB = "dspark_force_budget_frac"
# int(frac * n * gamma) must give k * n for every batch size n: k / gamma alone can land a hair under
# (3 / 7 * 14 = 5.999...), so the fraction carries this much more than k tokens per request.
ROUNDING_GUARD = 1e-6


@dataclass(frozen=True)
class Refusal:
    field: str
    reason: str  # a code: what the controller's decision carries
    message: str

    def to_dict(self) -> dict:
        return {"field": self.field, "reason": self.reason, "message": self.message}


class Refused(InvalidRequestError):
    """A field SGLang cannot apply at runtime (HTTP 400 naming it), with the reason code."""

    def __init__(self, field: str, message: str, reason: str = "") -> None:
        super().__init__(field, message)
        self.reason = reason

    def __reduce__(self):
        return type(self), (self.field, self.message, self.reason)


IGNORED = "sglang_knob_ignored"  # static mode, or compact without a profiled table: SGLang verifies all
NO_CLASSES = "sglang_no_class_budget"
NO_PLAIN = "sglang_no_runtime_plain_decoding"
NO_STEP_TIME = "sglang_no_runtime_step_time"


def split(budget: DraftBudget, verify_mode: str, sps_profiled: bool) -> tuple[DraftBudget, list[Refusal]]:
    """The part of `budget` SGLang can apply at runtime, and one refusal per field it cannot."""
    refusals: list[Refusal] = []
    for name in ("max_step_tokens", "max_request_tokens", "max_request_tokens_by_class", "max_step_s"):
        try:
            force_budget_frac(_only(budget, name), 1, verify_mode, sps_profiled, running=1)
        except Refused as exc:
            refusals.append(Refusal(exc.field, exc.reason, exc.message))
    refused = {r.field for r in refusals}
    kept = replace(
        budget,
        max_step_tokens=None if "max_step_tokens" in refused else budget.max_step_tokens,
        max_request_tokens=None if "max_request_tokens" in refused else budget.max_request_tokens,
        max_request_tokens_by_class={}
        if "max_request_tokens_by_class" in refused
        else budget.max_request_tokens_by_class,
        max_step_s=None if "max_step_s" in refused else budget.max_step_s,
    )
    return kept, refusals


def force_budget_frac(
    budget: DraftBudget, gamma: int, verify_mode: str, sps_profiled: bool, running: int = 0
) -> float | None:
    """The `dspark_force_budget_frac` that applies `budget` with `running` requests in the batch (None
    clears the override); refusals name the field they cannot apply. `sps_profiled`: SGLang was given an
    SPS table it schedules with."""
    if budget.unlimited:
        return None
    if budget.max_step_s is not None:
        raise Refused(
            "max_step_s",
            "SGLang's prefill chunk per step (chunked_prefill_size) is set at launch, no runtime setter",
            NO_STEP_TIME,
        )
    if verify_mode != "compact":
        raise Refused(
            _first_limit(budget),
            f"SGLang runs SGLANG_RAGGED_VERIFY_MODE={verify_mode}, which verifies every drafted token and "
            f"ignores {KNOB}; serve with sglang.verify_mode: compact to move the budget",
            IGNORED,
        )
    if not sps_profiled:
        raise Refused(
            _first_limit(budget),
            f"SGLang runs compact mode without a profiled SPS table, so it verifies every drafted token and "
            f"ignores {KNOB}; give it one (sglang.sps_table) to move the budget",
            IGNORED,
        )
    if budget.max_request_tokens_by_class:
        raise Refused(
            "max_request_tokens_by_class",
            "SGLang has one budget for the whole batch, no per-SLA-class limit",
            NO_CLASSES,
        )
    for name in ("max_step_tokens", "max_request_tokens"):
        if getattr(budget, name) == 0:
            raise Refused(
                name, f"SGLang's {KNOB} lies in (0, 1]: plain decoding cannot be set at runtime", NO_PLAIN
            )
    k, step = budget.max_request_tokens, budget.max_step_tokens
    if step is None or running <= 0:  # with nobody running a step cap binds nothing (it is re-sent)
        return None if k is None or k >= gamma else (k + ROUNDING_GUARD) / gamma
    whole = running * gamma
    per_step = min(step, whole if k is None else k * running)
    return None if per_step >= whole else (per_step + ROUNDING_GUARD) / whole


def in_force(
    frac: float | None,
    gamma: int | None,
    verify_mode: str,
    sps_profiled: bool,
    step_cap: tuple[int, int] | None = None,
) -> dict:
    """The budget SGLang applies, in our fields plus SGLang's own terms. `step_cap`: (K, n) when it came
    as a step cap of K tokens at n running requests (then reported as that cap)."""
    mean = None if frac is None or gamma is None else int(frac * gamma)
    per_step = None if step_cap is None or frac is None else step_cap[0]
    meaning = (
        "every drafted token is verified"
        if verify_mode == "static"
        else "every drafted token is verified (compact mode without a profiled SPS table)"
        if not sps_profiled
        else "SGLang's SPS-optimal budget"
        if frac is None
        else f"each step verifies int({frac:.6g} x running requests x {gamma}) drafted tokens, "
        + (
            f"{mean} per request on average (an override: a mean, not a per-request cap)"
            if per_step is None
            else f"{per_step} at the {step_cap[1]} running when the cap arrived (an override scaling "
            "with the batch: a mean per request, not a fixed per-step cap)"
        )
    )
    return {
        "max_step_tokens": per_step,
        "max_request_tokens": mean if per_step is None else None,
        "max_request_tokens_by_class": {},
        "sglang": {"verify_mode": verify_mode, KNOB: frac, "meaning": meaning},
    }


def _only(budget: DraftBudget, name: str) -> DraftBudget:
    return DraftBudget(**{name: getattr(budget, name)})


def _first_limit(budget: DraftBudget) -> str:
    if budget.max_step_tokens is not None:
        return "max_step_tokens"
    if budget.max_request_tokens is not None:
        return "max_request_tokens"
    return "max_request_tokens_by_class"
