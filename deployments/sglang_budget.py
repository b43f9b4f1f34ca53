"""The controller's draft budget as SGLang's one runtime knob, or a refusal that says why.

SGLang 0.5.23 moves DSpark's verify budget at runtime only through `set_internal_state` with
`dspark_force_budget_frac` (scheduler_components/internal_state.py -> DSparkWorkerV2 -> the planner's
HostConfidenceBudgetPlanner). Its meaning differs from our DraftBudget's, so the mapping is narrow:

- SGLang's frac is an OVERRIDE: every step verifies exactly int(frac * running requests * gamma) drafted
  tokens, handed to the most confident drafts across the batch, in place of its SPS-optimal choice. Ours
  are CAPS. The one cap that has a faithful reading is `max_request_tokens = k` with 0 < k < gamma: the
  batch verifies k drafted tokens per running request on average (frac = k / gamma). It is reported as
  that mean, never as a per-request cap.
- k >= gamma limits nothing: the override is cleared (SGLang's own SPS-optimal budget).
- Refused, by field: `max_step_tokens` (SGLang's budget scales with the batch; no fixed per-step cap),
  `max_request_tokens_by_class` (one budget for the whole batch, no SLA classes), k = 0 (frac must be
  in (0, 1]: plain decoding is not reachable at runtime), and anything but "no limit" where SGLang
  verifies every drafted token and accepts the knob as a no-op: static mode, and compact mode without a
  profiled SPS table (dspark_planner.py: a missing or flat table makes its planner verify-all).
"""

from __future__ import annotations

from dspark.draft_budget import DraftBudget
from dspark.errors import InvalidRequestError

KNOB = "dspark_force_budget_frac"
# int(frac * n * gamma) must give k * n for every batch size n: k / gamma alone can land a hair under
# (3 / 7 * 14 = 5.999...), so the fraction carries this much more than k tokens per request.
ROUNDING_GUARD = 1e-6


def force_budget_frac(budget: DraftBudget, gamma: int, verify_mode: str, sps_profiled: bool) -> float | None:
    """The `dspark_force_budget_frac` that applies `budget` (None clears the override); refusals name
    the field they cannot apply. `sps_profiled`: SGLang was given an SPS table it schedules with."""
    if budget.unlimited:
        return None
    if verify_mode != "compact":
        raise InvalidRequestError(
            _first_limit(budget),
            f"SGLang runs SGLANG_RAGGED_VERIFY_MODE={verify_mode}, which verifies every drafted token and "
            f"ignores {KNOB}; serve with sglang.verify_mode: compact to move the budget",
        )
    if not sps_profiled:
        raise InvalidRequestError(
            _first_limit(budget),
            f"SGLang runs compact mode without a profiled SPS table, so it verifies every drafted token and "
            f"ignores {KNOB}; give it one (sglang.sps_table) to move the budget",
        )
    if budget.max_request_tokens_by_class:
        raise InvalidRequestError(
            "max_request_tokens_by_class", "SGLang has one budget for the whole batch, no per-SLA-class limit"
        )
    if budget.max_step_tokens is not None:
        raise InvalidRequestError(
            "max_step_tokens",
            f"SGLang's budget ({KNOB}) scales with the running requests; it has no fixed per-step cap",
        )
    k = budget.max_request_tokens
    if k == 0:
        raise InvalidRequestError(
            "max_request_tokens", f"SGLang's {KNOB} lies in (0, 1]: plain decoding cannot be set at runtime"
        )
    if k >= gamma:
        return None
    return (k + ROUNDING_GUARD) / gamma


def in_force(frac: float | None, gamma: int | None, verify_mode: str, sps_profiled: bool) -> dict:
    """The budget SGLang applies, in our fields plus SGLang's own terms."""
    mean = None if frac is None or gamma is None else int(frac * gamma)
    return {
        "max_step_tokens": None,
        "max_request_tokens": mean,
        "max_request_tokens_by_class": {},
        "sglang": {
            "verify_mode": verify_mode,
            KNOB: frac,
            "meaning": (
                "every drafted token is verified"
                if verify_mode == "static"
                else "every drafted token is verified (compact mode without a profiled SPS table)"
                if not sps_profiled
                else "SGLang's SPS-optimal budget"
                if frac is None
                else f"each step verifies int({frac:.6g} x running requests x {gamma}) drafted tokens, "
                f"{mean} per request on average (an override: a mean, not a per-request cap)"
            ),
        },
    }


def _first_limit(budget: DraftBudget) -> str:
    if budget.max_step_tokens is not None:
        return "max_step_tokens"
    if budget.max_request_tokens is not None:
        return "max_request_tokens"
    return "max_request_tokens_by_class"
