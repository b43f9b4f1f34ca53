"""The synchronous client."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import grpc

from dspark_client import health
from dspark_client.connection import Connection, Deadline
from dspark_client.errors import DSparkClientError, from_rpc_error
from dspark_client.proto import GenerationStub, pb
from dspark_client.types import (
    Completion,
    CompletionBuilder,
    Delta,
    ModelInfo,
    ReplicaLoad,
    build_request,
    loads_of,
    model_info_of,
)

T = TypeVar("T")


class GenerationStream:
    """Iterator of Deltas for one request; `completion` holds usage and speculation stats at the end.

    Closing it early (`cancel()`, leaving a `with` block, garbage collection) cancels the RPC, and the
    server aborts the request and frees its KV cache.
    """

    def __init__(self, client: Client, request: pb.GenerateRequest, timeout_s: float | None) -> None:
        self._client, self._request = client, request
        self._deadline = Deadline(timeout_s)
        self._builder = CompletionBuilder(request.request_id)
        self._call = None
        self._attempt = 0
        self._received = False

    @property
    def request_id(self) -> str:
        return self._request.request_id

    @property
    def completion(self) -> Completion | None:
        return self._builder.completion

    def __iter__(self) -> GenerationStream:
        return self

    def __next__(self) -> Delta:
        conn = self._client.connection
        while True:
            if self._call is None:
                self._attempt += 1
                self._call = self._client._stub.Generate(
                    self._request,
                    timeout=self._deadline.remaining(self.request_id),
                    metadata=conn.metadata(self.request_id),
                )
            try:
                response = next(self._call)
            except StopIteration:
                if self._builder.completion is None:
                    raise DSparkClientError(
                        grpc.StatusCode.UNKNOWN,
                        "stream ended before its final message",
                        None,
                        None,
                        self.request_id,
                    ) from None
                raise
            except grpc.RpcError as err:
                error = from_rpc_error(err, self.request_id)
                # Only before the first message: the request never ran, so running it again is safe.
                if not self._received and conn.retry.should_retry(self._attempt, error):
                    delay = conn.retry.delay(self._attempt, error)
                    if self._deadline.allows_wait(delay):
                        time.sleep(delay)
                        self._call = None
                        continue
                raise error from None
            self._received = True
            delta = self._builder.add(response)
            if delta is not None:
                return delta

    def cancel(self) -> None:
        if self._call is not None:
            self._call.cancel()

    def __enter__(self) -> GenerationStream:
        return self

    def __exit__(self, *exc) -> None:
        if self.completion is None:
            self.cancel()

    def __del__(self) -> None:
        if getattr(self, "_call", None) is not None and self.completion is None:
            self._call.cancel()


class Client:
    """Blocking client of the DSpark Generation service.

    `Client("host:9000", token=..., root_certificates=...)`; every call takes `timeout` (seconds, the
    deadline over all retries) and raises a typed `DSparkClientError`.
    """

    def __init__(self, target: str = "localhost:9000", **options) -> None:
        self.connection = Connection(target, **options)
        self._channel = self.connection.sync_channel()
        self._stub = GenerationStub(self._channel)

    def stream(
        self, prompt: str | None = None, *, timeout: float | None = None, **kwargs
    ) -> GenerationStream:
        """Start a request; iterate the result for Deltas. kwargs: see `types.build_request`."""
        request = build_request(prompt, **kwargs)
        return GenerationStream(self, request, timeout if timeout is not None else self.connection.timeout_s)

    def generate(self, prompt: str | None = None, *, timeout: float | None = None, **kwargs) -> Completion:
        with self.stream(prompt, timeout=timeout, **kwargs) as stream:
            for _ in stream:
                pass
        assert stream.completion is not None
        return stream.completion

    def abort(self, request_id: str, timeout: float | None = None) -> bool:
        """Stop a running request; False when it is not running (idempotent, so retried)."""
        return self._unary(self._stub.Abort, pb.AbortRequest(request_id=request_id), timeout).aborted

    def model_info(self, timeout: float | None = None) -> ModelInfo:
        return model_info_of(self._unary(self._stub.GetModelInfo, pb.GetModelInfoRequest(), timeout))

    def loads(self, timeout: float | None = None) -> list[ReplicaLoad]:
        return loads_of(self._unary(self._stub.GetLoads, pb.GetLoadsRequest(), timeout))

    def health(self, service: str = "", timeout: float | None = None) -> str:
        """The standard grpc.health.v1 status name: "SERVING", "NOT_SERVING", ..."""
        method = self._channel.unary_unary(
            health.CHECK_METHOD,
            request_serializer=health.encode_request,
            response_deserializer=health.decode_response,
        )
        return self._unary(method, service, timeout)

    def _unary(self, method: Callable[..., T], request, timeout: float | None) -> T:
        conn = self.connection
        deadline = Deadline(timeout if timeout is not None else conn.timeout_s)
        attempt = 0
        while True:
            attempt += 1
            try:
                return method(request, timeout=deadline.remaining(), metadata=conn.metadata())
            except grpc.RpcError as err:
                error = from_rpc_error(err)
                delay = conn.retry.delay(attempt, error)
                if not (conn.retry.should_retry(attempt, error) and deadline.allows_wait(delay)):
                    raise error from None
                time.sleep(delay)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def iter_text(stream: Iterator[Delta]) -> Iterator[str]:
    """Just the text of each delta."""
    for delta in stream:
        yield delta.text
