"""The one place that maps errors to HTTP statuses, gRPC codes and OpenAI error bodies.

Engine errors (`dspark.errors`) arrive here directly or wrapped by Ray (RayTaskError.cause) when they
crossed from a replica; anything unrecognised is a 500 / INTERNAL with a generic message, logged.
"""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import dataclass

import grpc
from ray.exceptions import RayActorError, RayTaskError, TaskCancelledError
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError

from dspark.errors import (
    AdmissionError,
    DSparkError,
    EngineDeadError,
    InvalidRequestError,
    ModelLoadError,
    RequestFailedError,
)

log = logging.getLogger(__name__)

# gRPC trailing metadata keys; dspark_client.errors reads the same names.
FIELD_KEY = "dspark-field"
RETRY_AFTER_KEY = "retry-after-ms"


class DuplicateRequestError(DSparkError):
    """A request with this id is already running (409 / ALREADY_EXISTS): a retry must not run it twice."""


class NotFoundError(DSparkError):
    """No such thing (404 / NOT_FOUND): e.g. a health check for a service this server does not run."""


class UnauthorizedError(DSparkError):
    """Missing or wrong bearer token (401 / UNAUTHENTICATED)."""


@dataclass(frozen=True)
class ErrorInfo:
    http_status: int
    grpc_code: grpc.StatusCode
    type: str  # OpenAI error type
    message: str
    field: str | None = None
    retry_after_s: float | None = None

    def openai_body(self) -> dict:
        code = {400: "invalid_request", 401: "invalid_api_key", 409: "duplicate_request", 429: "overloaded"}
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.field,
                "code": code.get(self.http_status, self.grpc_code.name.lower()),
            }
        }

    def http_headers(self) -> dict[str, str]:
        if self.retry_after_s is None:
            return {}
        return {"Retry-After": str(max(1, math.ceil(self.retry_after_s)))}

    def grpc_trailers(self) -> tuple[tuple[str, str], ...]:
        meta = []
        if self.field:
            meta.append((FIELD_KEY, self.field))
        if self.retry_after_s is not None:
            meta.append((RETRY_AFTER_KEY, str(int(self.retry_after_s * 1000))))
        return tuple(meta)


def unwrap(exc: BaseException) -> BaseException:
    """The error a replica raised, from inside Ray's wrappers."""
    while isinstance(exc, RayTaskError) and getattr(exc, "cause", None) is not None:
        exc = exc.cause
    return exc


def classify(exc: BaseException) -> ErrorInfo:
    exc = unwrap(exc)
    if isinstance(exc, InvalidRequestError):
        return ErrorInfo(400, grpc.StatusCode.INVALID_ARGUMENT, "invalid_request_error", str(exc), exc.field)
    if isinstance(exc, AdmissionError):
        return ErrorInfo(
            429,
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "overloaded_error",
            f"{exc.reason}; retry in {exc.retry_after_s:g}s",
            retry_after_s=exc.retry_after_s,
        )
    if isinstance(exc, BackPressureError):
        return ErrorInfo(
            429, grpc.StatusCode.RESOURCE_EXHAUSTED, "overloaded_error", exc.message, retry_after_s=1.0
        )
    if isinstance(exc, DuplicateRequestError):
        return ErrorInfo(409, grpc.StatusCode.ALREADY_EXISTS, "invalid_request_error", str(exc), "request_id")
    if isinstance(exc, NotFoundError):
        return ErrorInfo(404, grpc.StatusCode.NOT_FOUND, "not_found_error", str(exc))
    if isinstance(exc, UnauthorizedError):
        return ErrorInfo(401, grpc.StatusCode.UNAUTHENTICATED, "authentication_error", str(exc))
    if isinstance(exc, EngineDeadError | DeploymentUnavailableError | RayActorError | ModelLoadError):
        return ErrorInfo(
            503, grpc.StatusCode.UNAVAILABLE, "service_unavailable", str(exc) or type(exc).__name__
        )
    if isinstance(exc, RequestFailedError):  # the engine stopped this request alone; say why
        return ErrorInfo(500, grpc.StatusCode.INTERNAL, "internal_error", str(exc))
    if isinstance(exc, TaskCancelledError | asyncio.CancelledError):
        return ErrorInfo(499, grpc.StatusCode.CANCELLED, "cancelled", "request cancelled")
    if isinstance(exc, TimeoutError):
        return ErrorInfo(504, grpc.StatusCode.DEADLINE_EXCEEDED, "timeout", "request timed out")
    log.error("unexpected error while serving a request", exc_info=exc)
    return ErrorInfo(
        500, grpc.StatusCode.INTERNAL, "internal_error", f"internal error ({type(exc).__name__})"
    )
