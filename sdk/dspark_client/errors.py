"""Typed errors: every failed call raises a DSparkClientError subclass chosen by its gRPC status."""

from __future__ import annotations

import re

import grpc

# Trailing metadata the server sets on errors (deployments/errors.py writes them).
FIELD_KEY = "dspark-field"
RETRY_AFTER_KEY = "retry-after-ms"
# Ray Serve's gRPC proxy drops trailers on errors, so the server also writes both into the message:
# "max_tokens: must be >= 1, got 0" and "engine full: ...; retry in 1s".
_FIELD_IN_MESSAGE = re.compile(r"^([A-Za-z_][\w.\[\]]*): ")
_RETRY_IN_MESSAGE = re.compile(r"retry in ([0-9.]+)s")
_FIELD_CODES = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.ALREADY_EXISTS)


class DSparkClientError(Exception):
    """A call failed. `code` is the gRPC status; `field` names the request field at fault, if any."""

    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        field: str | None = None,
        retry_after_s: float | None = None,
        request_id: str | None = None,
    ) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code, self.message, self.field = code, message, field
        self.retry_after_s, self.request_id = retry_after_s, request_id


class InvalidArgumentError(DSparkClientError):
    """The request is wrong; retrying it unchanged fails again."""


class ResourceExhaustedError(DSparkClientError):
    """The service is full; retry after `retry_after_s`."""


class DeadlineExceededError(DSparkClientError):
    pass


class UnavailableError(DSparkClientError):
    pass


class CancelledError(DSparkClientError):
    pass


class AlreadyExistsError(DSparkClientError):
    """ALREADY_EXISTS. dspark-serve itself never answers it: a reused request_id runs apart."""


class NotFoundError(DSparkClientError):
    pass


class UnauthenticatedError(DSparkClientError):
    pass


_BY_CODE = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceededError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.CANCELLED: CancelledError,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExistsError,
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.UNAUTHENTICATED: UnauthenticatedError,
}


def from_rpc_error(err: grpc.RpcError, request_id: str | None = None) -> DSparkClientError:
    """Translate a grpc.RpcError (sync or aio) into the typed error, reading the server's trailers."""
    code = err.code() if callable(getattr(err, "code", None)) else grpc.StatusCode.UNKNOWN
    details = err.details() if callable(getattr(err, "details", None)) else str(err)
    trailers = err.trailing_metadata() if callable(getattr(err, "trailing_metadata", None)) else None
    meta = dict(trailers or ())
    details = details or code.name
    field = meta.get(FIELD_KEY) or None
    if field is None and code in _FIELD_CODES and (m := _FIELD_IN_MESSAGE.match(details)):
        field = m.group(1)
    retry_after_s = float(meta[RETRY_AFTER_KEY]) / 1000 if meta.get(RETRY_AFTER_KEY) else None
    if retry_after_s is None and code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        m = _RETRY_IN_MESSAGE.search(details)
        retry_after_s = float(m.group(1)) if m else None
    cls = _BY_CODE.get(code, DSparkClientError)
    return cls(code, details, field=field, retry_after_s=retry_after_s, request_id=request_id)
