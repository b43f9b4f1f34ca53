"""The gRPC surface: dspark.v1.Generation and grpc.health.v1.Health.

Ray Serve's gRPC proxy calls an ingress method named after each RPC, passing the request message and
a `grpc_context`. Errors set their code on that context and raise: the proxy then answers with that
code and message (it drops trailing metadata on errors, so the message carries the field name).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import aclosing

from grpc_health.v1 import health_pb2
from ray import serve

from deployments import replicas, validation
from deployments.errors import NotFoundError, classify
from deployments.events import StreamEvent
from deployments.frontend import fail_span
from dspark.errors import InvalidRequestError
from dspark.telemetry import semconv
from dspark_client.proto import SERVICE_NAME, pb

TARGET_DEPLOYMENT = "TargetReplica"
HEALTH_TIMEOUT_S = 5.0
WATCH_PERIOD_S = 1.0


class ServiceError(Exception):
    """What an RPC raises after setting its status on the context; only its message travels on."""


def _fail(grpc_context, exc: BaseException) -> ServiceError:
    info = classify(exc)
    grpc_context.set_code(info.grpc_code)
    grpc_context.set_details(info.message)
    grpc_context.set_trailing_metadata(list(info.grpc_trailers()))
    return ServiceError(info.message)


def _final(rid: str, last: StreamEvent) -> pb.GenerateResponse:
    s = last.speculation
    return pb.GenerateResponse(
        request_id=rid,
        final=pb.Final(
            finish_reason=last.finish_reason or "",
            usage=pb.Usage(
                prompt_tokens=last.prompt_tokens,
                completion_tokens=last.completion_tokens,
                total_tokens=last.prompt_tokens + last.completion_tokens,
                cached_tokens=last.cached_tokens,
            ),
            speculation=pb.SpeculationStats(
                rounds=s.rounds,
                drafted_tokens=s.drafted_tokens,
                accepted_tokens=s.accepted_tokens,
                mean_accept_length=s.mean_accept_length,
            ),
        ),
    )


class GrpcService:
    """Mixed into the Ingress deployment, which provides the Frontend methods used here."""

    async def Generate(self, request: pb.GenerateRequest, grpc_context) -> AsyncIterator[pb.GenerateResponse]:
        metadata = _metadata(grpc_context)
        # The client's trace context arrives as gRPC metadata (traceparent), which Serve's proxy passes on.
        span = self.request_span(semconv.TEXT_COMPLETION, metadata)
        try:
            self.authorize(metadata.get("authorization"))
            stream = await self.open(validation.grpc_request(request, self.limits), span, metadata)
        except Exception as exc:
            fail_span(span, exc)
            raise _fail(grpc_context, exc) from None
        rid = stream.request_id
        span.set({semconv.GEN_AI_RESPONSE_ID: rid, semconv.GEN_AI_REQUEST_STREAM: True})
        try:  # from here the stream ends its span, however it ends
            async with aclosing(stream.events()) as events:
                async for event in events:
                    if event.text or event.token_ids:
                        yield pb.GenerateResponse(
                            request_id=rid, delta=pb.Delta(text=event.text, token_ids=list(event.token_ids))
                        )
                    if event.finished:
                        yield _final(rid, event)
        except Exception as exc:
            raise _fail(grpc_context, exc) from None

    async def Abort(self, request: pb.AbortRequest, grpc_context) -> pb.AbortResponse:
        try:
            self.authorize(_metadata(grpc_context).get("authorization"))
            if not request.request_id:
                raise InvalidRequestError("request_id", "must not be empty")
            return pb.AbortResponse(aborted=await self.abort(request.request_id))
        except Exception as exc:
            raise _fail(grpc_context, exc) from None

    async def GetModelInfo(self, request: pb.GetModelInfoRequest, grpc_context) -> pb.ModelInfo:
        try:
            self.authorize(_metadata(grpc_context).get("authorization"))
            info = await self.model_info()
            return pb.ModelInfo(**{k: info[k] for k in pb.ModelInfo.DESCRIPTOR.fields_by_name})
        except Exception as exc:
            raise _fail(grpc_context, exc) from None

    async def GetLoads(self, request: pb.GetLoadsRequest, grpc_context) -> pb.GetLoadsResponse:
        try:
            self.authorize(_metadata(grpc_context).get("authorization"))
            stats = await replicas.routing_stats(serve.get_replica_context().app_name, TARGET_DEPLOYMENT)
            return pb.GetLoadsResponse(replicas=[_load(s) for s in stats])
        except Exception as exc:
            raise _fail(grpc_context, exc) from None

    # ---- grpc.health.v1.Health --------------------------------------------------------------------

    async def Check(
        self, request: health_pb2.HealthCheckRequest, grpc_context
    ) -> health_pb2.HealthCheckResponse:
        try:
            return health_pb2.HealthCheckResponse(status=await self._serving_status(request.service))
        except Exception as exc:
            raise _fail(grpc_context, exc) from None

    async def Watch(self, request: health_pb2.HealthCheckRequest, grpc_context) -> AsyncIterator:
        """The status now, then again on every change, until the client leaves."""
        try:
            last = None
            while True:
                status = await self._serving_status(request.service)
                if status != last:
                    yield health_pb2.HealthCheckResponse(status=status)
                    last = status
                await asyncio.sleep(WATCH_PERIOD_S)
        except Exception as exc:
            raise _fail(grpc_context, exc) from None

    async def _serving_status(self, service: str) -> int:
        if service not in ("", SERVICE_NAME):
            raise NotFoundError(f"unknown service {service!r}; this server runs {SERVICE_NAME!r}")
        try:
            # Ready means a target replica answers, not just that this ingress is up.
            await asyncio.wait_for(self.model_info(), HEALTH_TIMEOUT_S)
        except Exception:
            return health_pb2.HealthCheckResponse.NOT_SERVING
        return health_pb2.HealthCheckResponse.SERVING


def _metadata(grpc_context) -> dict:
    return dict(grpc_context.invocation_metadata()) if grpc_context is not None else {}


def _load(stats: dict) -> pb.ReplicaLoad:
    return pb.ReplicaLoad(
        replica_id=stats.get("replica_id", ""),
        running_requests=stats.get("running_requests", 0),
        queued_requests=stats.get("queued_requests", 0),
        queued_prefill_tokens=stats.get("queued_prefill_tokens", 0),
        kv_unreserved_pages=stats.get("kv_unreserved_pages", 0),
        kv_total_pages=stats.get("kv_total_pages", 0),
        kv_headroom=stats.get("kv_headroom", 0.0),
        recent_tau=stats.get("recent_tau", 0.0),
        draft_budget_json=json.dumps(stats.get("draft_budget")),
        healthy=bool(stats.get("healthy", False)),
    )
