"""What the blocking and the asyncio clients share, free of any I/O: the request each call sends,
the retry decisions under one deadline, and the state of a stream. Each client only adds how it
waits (time.sleep or asyncio.sleep) and how it reads the channel."""

from __future__ import annotations

import grpc

from dspark_client import health, telemetry
from dspark_client.connection import Connection, Deadline
from dspark_client.errors import DSparkClientError, from_rpc_error
from dspark_client.proto import pb
from dspark_client.types import Completion, CompletionBuilder, Delta


class Attempts:
    """The attempts of one call under one deadline: what each sends, and whether an error is retried."""

    def __init__(self, connection: Connection, timeout_s: float | None, request_id: str | None = None):
        self.connection, self.request_id = connection, request_id
        self.deadline = Deadline(timeout_s)
        self.count = 0
        # The caller's trace context when the call starts; every attempt carries the same one.
        self.trace_metadata = telemetry.trace_metadata()

    def next(self) -> dict:
        """Keyword arguments of the next attempt's stub call (its share of the deadline, metadata)."""
        self.count += 1
        return {
            "timeout": self.deadline.remaining(self.request_id),
            "metadata": self.connection.metadata(self.request_id) + self.trace_metadata,
        }

    def retry_delay(self, err: grpc.RpcError, retryable: bool = True) -> float:
        """Seconds to wait before trying again; raises the typed error when the call must not be retried."""
        error = from_rpc_error(err, self.request_id)
        policy = self.connection.retry
        if retryable and policy.should_retry(self.count, error):
            delay = policy.delay(self.count, error)
            if self.deadline.allows_wait(delay):
                return delay
        raise error from None


class StreamState:
    """One Generate stream: its attempts, and the deltas and completion built from its messages.

    Only a stream that has received nothing is retried: then the request never ran, so running it
    again cannot run it twice.
    """

    def __init__(self, connection: Connection, request: pb.GenerateRequest, timeout_s: float | None):
        self.request = request
        self.attempts = Attempts(connection, timeout_s, request.request_id)
        self.builder = CompletionBuilder(request.request_id)
        self.received = False

    @property
    def completion(self) -> Completion | None:
        return self.builder.completion

    def retry_delay(self, err: grpc.RpcError) -> float:
        return self.attempts.retry_delay(err, retryable=not self.received)

    def on_message(self, response: pb.GenerateResponse) -> Delta | None:
        self.received = True
        delta = self.builder.add(response)
        if (completion := self.builder.completion) is not None and delta is None:
            usage = completion.usage
            telemetry.record_usage(
                usage.prompt_tokens,
                usage.completion_tokens,
                self.request.model,
                self.attempts.connection.meter_provider,
            )
        return delta

    def on_end(self) -> None:
        """The server closed the stream: fine after the final message, an error before it."""
        if self.builder.completion is None:
            raise DSparkClientError(
                grpc.StatusCode.UNKNOWN,
                "stream ended before its final message",
                None,
                None,
                self.request.request_id,
            )


class ClientBase:
    """Construction and the RPC table both clients share; `channel` is the one thing they open differently."""

    def __init__(self, connection: Connection, channel) -> None:
        from dspark_client.proto import GenerationStub

        self.connection = connection
        self._channel = channel
        self._stub = GenerationStub(channel)

    def _timeout(self, timeout: float | None) -> float | None:
        return timeout if timeout is not None else self.connection.timeout_s

    def _health_method(self):
        return self._channel.unary_unary(
            health.CHECK_METHOD,
            request_serializer=health.encode_request,
            response_deserializer=health.decode_response,
        )
