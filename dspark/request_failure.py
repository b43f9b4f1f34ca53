"""When one request's share of a step fails: what the request is told, and when the engine is to blame.

The engine runs each request's own work (its verify, sampling, emit, detokenizing) isolated; an
exception there stops that request alone with a `RequestFailedError`. One such failure is the
request's misfortune; many within a few steps say the engine itself is broken, and it reports itself
unhealthy so that Serve replaces it (`FailureWindow`).
"""

from __future__ import annotations

from collections import deque

import torch

from dspark.errors import DSparkError, RequestFailedError


def check_logits(logits: torch.Tensor) -> None:
    """Raise unless every row has a finite maximum: no NaN, no +inf, not all -inf (one reduction)."""
    if logits.numel() and not bool(torch.isfinite(logits.amax(dim=-1)).all()):
        raise RequestFailedError("the target's logits for this request are not finite (NaN or inf)")


def request_failure(request_id: str, exc: BaseException) -> RequestFailedError:
    """The error delivered to a failed request's stream. Our own errors say what went wrong; anything
    else is named by type only (its message may hold internals), the log has the traceback."""
    cause = str(exc) if isinstance(exc, DSparkError) else f"internal error ({type(exc).__name__})"
    return RequestFailedError(f"request {request_id} failed and was stopped: {cause}")


class FailureWindow:
    """Has the engine seen `max_failures` request failures within its last `window_steps` steps?"""

    def __init__(self, max_failures: int, window_steps: int) -> None:
        self.max_failures, self.window_steps = max_failures, window_steps
        self._steps: deque[int] = deque()

    def record(self, step: int) -> bool:
        """Count a failure at `step`; True once the window holds `max_failures` of them."""
        self._steps.append(step)
        while self._steps[0] <= step - self.window_steps:
            self._steps.popleft()
        return len(self._steps) >= self.max_failures
