"""How a client reaches the service: channel security, auth metadata, deadlines and retries."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

import grpc

from dspark_client.errors import DeadlineExceededError, DSparkClientError


@dataclass(frozen=True)
class RetryPolicy:
    """Retry refusals that guarantee the request did not run (so a retry cannot run it twice).

    RESOURCE_EXHAUSTED waits at least the server's retry hint; backoff is exponential with jitter.
    """

    max_attempts: int = 3
    initial_backoff_s: float = 0.1
    max_backoff_s: float = 2.0
    multiplier: float = 2.0
    retry_codes: frozenset = field(
        default_factory=lambda: frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED})
    )

    def delay(self, attempt: int, error: DSparkClientError) -> float:
        """Seconds to wait before attempt `attempt + 1` (attempts count from 1)."""
        backoff = min(self.max_backoff_s, self.initial_backoff_s * self.multiplier ** (attempt - 1))
        backoff *= 0.5 + random.random() / 2
        return max(backoff, error.retry_after_s or 0.0)

    def should_retry(self, attempt: int, error: DSparkClientError) -> bool:
        return attempt < self.max_attempts and error.code in self.retry_codes


NO_RETRY = RetryPolicy(max_attempts=1)


@dataclass(frozen=True)
class Connection:
    """Everything both clients share about the target; TLS is on when any certificate option is set."""

    target: str = "localhost:9000"
    tls: bool = False
    root_certificates: bytes | None = None
    private_key: bytes | None = None
    certificate_chain: bytes | None = None
    token: str | None = None  # sent as `authorization: Bearer <token>`
    application: str | None = None  # Ray Serve application name, when several share the proxy
    timeout_s: float | None = None  # default deadline per call
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    channel_options: tuple = ()
    # Where gen_ai.client.token.usage goes when OpenTelemetry is installed; None: the global provider.
    meter_provider: object = None

    @property
    def secure(self) -> bool:
        return self.tls or any((self.root_certificates, self.private_key, self.certificate_chain))

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(self.root_certificates, self.private_key, self.certificate_chain)

    def sync_channel(self) -> grpc.Channel:
        if self.secure:
            return grpc.secure_channel(self.target, self.credentials(), options=self.channel_options)
        return grpc.insecure_channel(self.target, options=self.channel_options)

    def aio_channel(self) -> grpc.aio.Channel:
        if self.secure:
            return grpc.aio.secure_channel(self.target, self.credentials(), options=self.channel_options)
        return grpc.aio.insecure_channel(self.target, options=self.channel_options)

    def metadata(self, request_id: str | None = None) -> tuple[tuple[str, str], ...]:
        # Plain metadata rather than call credentials: those are refused on insecure channels, and a
        # token over plaintext is the caller's choice to make (e.g. inside a cluster).
        meta = []
        if self.token:
            meta.append(("authorization", f"Bearer {self.token}"))
        if self.application:
            meta.append(("application", self.application))
        if request_id:
            meta.append(("request_id", request_id))  # Ray Serve's proxy tags its logs with it
        return tuple(meta)


class Deadline:
    """An absolute deadline spread over retries: each attempt gets what is left."""

    def __init__(self, timeout_s: float | None) -> None:
        self.at = None if timeout_s is None else time.monotonic() + timeout_s

    def remaining(self, request_id: str | None = None) -> float | None:
        if self.at is None:
            return None
        left = self.at - time.monotonic()
        if left <= 0:
            raise DeadlineExceededError(
                grpc.StatusCode.DEADLINE_EXCEEDED, "deadline exceeded", request_id=request_id
            )
        return left

    def allows_wait(self, seconds: float) -> bool:
        return self.at is None or time.monotonic() + seconds < self.at
