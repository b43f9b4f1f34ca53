"""The asyncio client: the same calls as `Client`, awaitable, with an async stream of deltas."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

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


class AsyncGenerationStream:
    """Async iterator of Deltas; `completion` is set once the stream ends. `cancel()` aborts it."""

    def __init__(self, client: AsyncClient, request: pb.GenerateRequest, timeout_s: float | None) -> None:
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

    def __aiter__(self) -> AsyncGenerationStream:
        return self

    async def __anext__(self) -> Delta:
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
                response = await self._call.read()
            except grpc.RpcError as err:
                error = from_rpc_error(err, self.request_id)
                if not self._received and conn.retry.should_retry(self._attempt, error):
                    delay = conn.retry.delay(self._attempt, error)
                    if self._deadline.allows_wait(delay):
                        await asyncio.sleep(delay)
                        self._call = None
                        continue
                raise error from None
            if response is grpc.aio.EOF:
                if self._builder.completion is None:
                    raise DSparkClientError(
                        grpc.StatusCode.UNKNOWN,
                        "stream ended before its final message",
                        None,
                        None,
                        self.request_id,
                    )
                raise StopAsyncIteration
            self._received = True
            delta = self._builder.add(response)
            if delta is not None:
                return delta

    def cancel(self) -> None:
        if self._call is not None:
            self._call.cancel()

    async def __aenter__(self) -> AsyncGenerationStream:
        return self

    async def __aexit__(self, *exc) -> None:
        if self.completion is None:
            self.cancel()


class AsyncClient:
    """asyncio client of the DSpark Generation service; create it inside the event loop that uses it."""

    def __init__(self, target: str = "localhost:9000", **options) -> None:
        self.connection = Connection(target, **options)
        self._channel = self.connection.aio_channel()
        self._stub = GenerationStub(self._channel)

    def stream(
        self, prompt: str | None = None, *, timeout: float | None = None, **kwargs
    ) -> AsyncGenerationStream:
        request = build_request(prompt, **kwargs)
        return AsyncGenerationStream(
            self, request, timeout if timeout is not None else self.connection.timeout_s
        )

    async def generate(
        self, prompt: str | None = None, *, timeout: float | None = None, **kwargs
    ) -> Completion:
        async with self.stream(prompt, timeout=timeout, **kwargs) as stream:
            async for _ in stream:
                pass
        assert stream.completion is not None
        return stream.completion

    async def abort(self, request_id: str, timeout: float | None = None) -> bool:
        response = await self._unary(self._stub.Abort, pb.AbortRequest(request_id=request_id), timeout)
        return response.aborted

    async def model_info(self, timeout: float | None = None) -> ModelInfo:
        return model_info_of(await self._unary(self._stub.GetModelInfo, pb.GetModelInfoRequest(), timeout))

    async def loads(self, timeout: float | None = None) -> list[ReplicaLoad]:
        return loads_of(await self._unary(self._stub.GetLoads, pb.GetLoadsRequest(), timeout))

    async def health(self, service: str = "", timeout: float | None = None) -> str:
        method = self._channel.unary_unary(
            health.CHECK_METHOD,
            request_serializer=health.encode_request,
            response_deserializer=health.decode_response,
        )
        return await self._unary(method, service, timeout)

    async def _unary(self, method: Callable[..., Any], request, timeout: float | None):
        conn = self.connection
        deadline = Deadline(timeout if timeout is not None else conn.timeout_s)
        attempt = 0
        while True:
            attempt += 1
            try:
                return await method(request, timeout=deadline.remaining(), metadata=conn.metadata())
            except grpc.RpcError as err:
                error = from_rpc_error(err)
                delay = conn.retry.delay(attempt, error)
                if not (conn.retry.should_retry(attempt, error) and deadline.allows_wait(delay)):
                    raise error from None
                await asyncio.sleep(delay)

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()
