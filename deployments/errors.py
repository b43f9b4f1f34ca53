"""The one place that maps errors to HTTP statuses, gRPC codes and OpenAI error bodies.

Engine errors (`dspark.errors`) arrive here directly or wrapped by Ray (RayTaskError.cause) when they
crossed from a replica; anything unrecognised is a 500 / INTERNAL with a generic message, logged.
A request schema's pydantic ValidationError becomes an InvalidRequestError here too (`invalid_request`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from dataclasses import dataclass

import grpc
from fastapi.responses import Response
from pydantic import ValidationError
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
# pydantic errors whose message already says all there is; the others also show what was sent.
_COMPLETE = {"missing", "lone_surrogate", "empty", "batch", "identifier"}
_SHOWN_CHARS = 40
# pydantic's messages in the client's words ("a valid dictionary or instance of StreamOptions": an object).
_PLAIN = {
    "model_type": "must be an object",
    "model_attributes_type": "must be an object",
    "dict_type": "must be an object",
    "list_type": "must be an array",
    "string_type": "must be a string",
    "string_unicode": "must be valid Unicode: a lone surrogate has no UTF-8 encoding",
    "int_type": "must be an integer",
    "float_type": "must be a number",
    "bool_type": "must be a boolean",
    "finite_number": "must be a finite number",
}


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
        code = {400: "invalid_request", 401: "invalid_api_key", 429: "overloaded"}
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


def invalid_request(exc: ValidationError) -> InvalidRequestError:
    """A request schema's first complaint, naming the field path: `messages[0].content: must be ...`."""
    errors = exc.errors(include_url=False)
    first = errors[0]
    message = _rephrase(first["type"], first["msg"])
    if first["type"] not in _COMPLETE:
        message += f" (got {describe(first['input'])})"
    if len(errors) > 1:
        message += f"; and {len(errors) - 1} more error{'s' if len(errors) > 2 else ''}"
    return InvalidRequestError(field_path(first["loc"]) or "body", message)


def field_path(loc: tuple[int | str, ...]) -> str:
    """pydantic's location as the client wrote the field: ('messages', 0, 'content') -> messages[0].content.

    Tagged unions add their tag to the location; the schemas write tags <like this>, so they are dropped.
    """
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif not part.startswith("<"):
            path += f".{part}" if path else part
    return path


def describe(value: object) -> str:
    """A short ASCII account of a client's value: never a long echo, never a character JSON can't carry."""
    if isinstance(value, str) and len(value) <= _SHOWN_CHARS:
        return ascii(value)
    if isinstance(value, str):
        return f"a string of {len(value)} characters"
    if isinstance(value, bool | float) or value is None:
        return ascii(value)
    if isinstance(value, int):
        return ascii(value) if abs(value) < 10**_SHOWN_CHARS else f"an integer of {value.bit_length()} bits"
    if isinstance(value, list):
        return f"an array of {len(value)} items"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _rephrase(kind: str, message: str) -> str:
    if kind in _PLAIN:
        return _PLAIN[kind]
    # pydantic says "Input should be ...", "List should have ...": our messages say "must ...".
    for subject in ("Input should", "String should", "List should", "Value should", "Dictionary should"):
        if message.startswith(subject):
            return "must" + message[len(subject) :]
    return "is required" if message == "Field required" else message


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


def error_response(exc: BaseException) -> Response:
    """The HTTP answer to `exc`: its status, headers (a retry hint) and OpenAI error body."""
    info = classify(exc)
    # ASCII JSON: an error body must encode whatever its message quotes (JSONResponse writes UTF-8,
    # which a lone surrogate cannot be).
    return Response(
        json.dumps(info.openai_body()),
        status_code=info.http_status,
        headers=info.http_headers(),
        media_type="application/json",
    )
