"""Error types of the engine; the serving layer maps them to gRPC codes and HTTP statuses in one place."""

from __future__ import annotations


class DSparkError(Exception):
    """Base class of every error the kit raises on purpose."""


class InvalidRequestError(DSparkError, ValueError):
    """The request itself is wrong (HTTP 400, gRPC INVALID_ARGUMENT); `field` names the culprit."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message

    def __reduce__(self):
        # Errors cross process boundaries (Ray replicas); pickle rebuilds from (field, message).
        return type(self), (self.field, self.message)


class AdmissionError(DSparkError):
    """The engine cannot take the request now (HTTP 429, gRPC RESOURCE_EXHAUSTED).

    Running requests are never harmed to make room; the caller may retry after `retry_after_s`.
    """

    def __init__(self, reason: str, retry_after_s: float = 1.0) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after_s = retry_after_s


class ModelLoadError(DSparkError):
    """A checkpoint directory cannot be served (missing files, unsupported architecture, bad weights)."""


class EngineDeadError(DSparkError):
    """The engine stopped (shutdown or an internal failure) before the request finished."""


class RequestFailedError(DSparkError):
    """Processing this one request failed inside the engine (HTTP 500, gRPC INTERNAL).

    Only that request was stopped and its KV pages freed; every other request carried on unchanged.
    """
