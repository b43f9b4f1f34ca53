"""The asyncio client: the same calls as `Client`, awaitable, with an async stream of deltas."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

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


class AsyncGenerationStream:
    """Async iterator of Deltas; `completion` is set once the stream ends. `cancel()` aborts it."""

    def __init__(self, client: AsyncClient, request: pb.GenerateRequest, timeout_s: float | None) -> None:
        self._client = client
        self._state = StreamState(client.connection, request, timeout_s)
        self._call = None

    @property
    def request_id(self) -> str:
        return self._state.request.request_id

    @property
    def completion(self) -> Completion | None:
        return self._state.completion

    def __aiter__(self) -> AsyncGenerationStream:
        return self

    async def __anext__(self) -> Delta:
        state = self._state
        while True:
            if self._call is None:
                self._call = self._client._stub.Generate(state.request, **state.attempts.next())
            try:
                response = await self._call.read()
            except grpc.RpcError as err:
                await asyncio.sleep(state.retry_delay(err))
                self._call = None
                continue
            if response is grpc.aio.EOF:
                state.on_end()
                raise StopAsyncIteration
            delta = state.on_message(response)
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


class AsyncClient(ClientBase):
    """asyncio client of the DSpark Generation service; create it inside the event loop that uses it."""

    def __init__(self, target: str = "localhost:9000", **options) -> None:
        connection = Connection(target, **options)
        super().__init__(connection, connection.aio_channel())

    def stream(
        self, prompt: str | None = None, *, timeout: float | None = None, **kwargs
    ) -> AsyncGenerationStream:
        return AsyncGenerationStream(self, build_request(prompt, **kwargs), self._timeout(timeout))

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
        return await self._unary(self._health_method(), service, timeout)

    async def _unary(self, method: Callable[..., Any], request, timeout: float | None):
        attempts = Attempts(self.connection, self._timeout(timeout))
        while True:
            try:
                return await method(request, **attempts.next())
            except grpc.RpcError as err:
                await asyncio.sleep(attempts.retry_delay(err))

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()
