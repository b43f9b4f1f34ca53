"""The synchronous client."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import grpc

from dspark_client.connection import Connection
from dspark_client.core import Attempts, ClientBase, StreamState
from dspark_client.proto import pb
from dspark_client.types import (
    Completion,
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
        self._client = client
        self._state = StreamState(client.connection, request, timeout_s)
        self._call = None

    @property
    def request_id(self) -> str:
        return self._state.request.request_id

    @property
    def completion(self) -> Completion | None:
        return self._state.completion

    def __iter__(self) -> GenerationStream:
        return self

    def __next__(self) -> Delta:
        state = self._state
        while True:
            if self._call is None:
                self._call = self._client._stub.Generate(state.request, **state.attempts.next())
            try:
                response = next(self._call)
            except StopIteration:
                state.on_end()
                raise
            except grpc.RpcError as err:
                time.sleep(state.retry_delay(err))
                self._call = None
                continue
            delta = state.on_message(response)
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


class Client(ClientBase):
    """Blocking client of the DSpark Generation service.

    `Client("host:9000", token=..., root_certificates=...)`; every call takes `timeout` (seconds, the
    deadline over all retries) and raises a typed `DSparkClientError`.
    """

    def __init__(self, target: str = "localhost:9000", **options) -> None:
        connection = Connection(target, **options)
        super().__init__(connection, connection.sync_channel())

    def stream(
        self, prompt: str | None = None, *, timeout: float | None = None, **kwargs
    ) -> GenerationStream:
        """Start a request; iterate the result for Deltas. kwargs: see `types.build_request`."""
        return GenerationStream(self, build_request(prompt, **kwargs), self._timeout(timeout))

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
        return self._unary(self._health_method(), service, timeout)

    def _unary(self, method: Callable[..., T], request, timeout: float | None) -> T:
        attempts = Attempts(self.connection, self._timeout(timeout))
        while True:
            try:
                return method(request, **attempts.next())
            except grpc.RpcError as err:
                time.sleep(attempts.retry_delay(err))

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
