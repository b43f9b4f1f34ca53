"""The OpenAI-compatible HTTP surface: /v1/models, /v1/completions, /v1/chat/completions, /health.

Routes read the raw body and validate it themselves (deployments/validation.py), so every bad input
is a 400 naming its field in OpenAI's error shape, never FastAPI's 422 or a 500.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import aclosing

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from ray import serve

from deployments import controller_api, validation
from deployments import openai_format as fmt
from deployments.errors import classify, error_response
from deployments.frontend import Frontend, Stream, fail_span
from dspark.errors import InvalidRequestError
from dspark.telemetry import semconv

# FastAPI's own OpenTelemetry (on the process's global providers, dspark/telemetry/setup.py) gives every
# HTTP request its server span and http.server.* metrics; the request's GenAI span is that span's child.
# Its per-function operation spans (dependencies, endpoint, serialization) are noise here: off.
app = FastAPI(title="DSpark", docs_url=None, redoc_url=None, telemetry={"operation_spans": False})
app.include_router(controller_api.router)  # the cluster controller's admin surface
HEALTH_TIMEOUT_S = 5.0


def _frontend() -> Frontend:
    return serve.get_replica_context().servable_object


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length", "")
    # A header of thousands of digits is no size at all (and int() refuses over 4300 digits).
    if declared.isascii() and declared.isdigit() and (len(declared) > 18 or int(declared) > limit):
        raise InvalidRequestError("body", f"Content-Length exceeds the limit of {limit} bytes")
    body = bytearray()
    async for chunk in request.stream():  # bounded even when no Content-Length was sent
        body += chunk
        if len(body) > limit:
            raise InvalidRequestError("body", f"more than the limit of {limit} bytes")
    return bytes(body)


@app.get("/health")
async def health() -> Response:
    try:
        await asyncio.wait_for(_frontend().model_info(), HEALTH_TIMEOUT_S)
    except Exception as exc:
        return error_response(exc)
    return JSONResponse({"status": "ok"})


@app.get("/v1/models")
async def models(request: Request) -> Response:
    frontend = _frontend()
    try:
        frontend.authorize(request.headers.get("authorization"))
    except Exception as exc:
        return error_response(exc)
    return JSONResponse(fmt.models_body(frontend.model_name, frontend.created))


@app.post("/v1/completions")
async def completions(request: Request) -> Response:
    return await _generate(request, chat=False)


@app.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    return await _generate(request, chat=True)


async def _generate(request: Request, chat: bool) -> Response:
    frontend = _frontend()
    # The client's W3C trace context (traceparent) is continued; failures before the stream count too.
    span = frontend.request_span(semconv.CHAT if chat else semconv.TEXT_COMPLETION, request.headers)
    try:
        frontend.authorize(request.headers.get("authorization"))
        body = validation.parse_json_body(
            await _read_body(request, frontend.limits.max_request_bytes), frontend.limits
        )
        parse = validation.chat_request if chat else validation.completion_request
        req = parse(body, frontend.limits)
        stream = await frontend.open(req, span, request.headers)
    except Exception as exc:
        fail_span(span, exc)
        return error_response(exc)
    rid = ("chatcmpl-" if chat else "cmpl-") + stream.request_id
    span.set({semconv.GEN_AI_RESPONSE_ID: rid, semconv.GEN_AI_REQUEST_STREAM: req.stream})
    if req.stream:
        return StreamingResponse(
            _sse(stream, rid, frontend, chat, req.include_usage),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Request-Id": stream.request_id},
        )
    try:
        parts, last = [], stream.first
        async with aclosing(stream.events()) as events:
            async for event in events:
                parts.append(event.text)
                last = event
    except Exception as exc:
        return error_response(exc)
    build = fmt.chat_body if chat else fmt.completion_body
    return JSONResponse(build(rid, frontend.model_name, frontend.created, "".join(parts), last))


async def _sse(
    stream: Stream, rid: str, frontend: Frontend, chat: bool, include_usage: bool
) -> AsyncIterator[bytes]:
    model, created = frontend.model_name, frontend.created
    first, last = True, stream.first
    text_chunk = fmt.TextChunks(rid, model, created, chat)  # most chunks: the per-token path
    try:
        async with aclosing(stream.events()) as events:
            async for event in events:
                last = event
                if not (event.text or event.finished or (chat and first)):
                    continue  # a step that produced no printable text yet (an incomplete UTF-8 char)
                if chat and first:
                    yield fmt.sse(fmt.chat_chunk(rid, model, created, event, first))
                else:
                    yield text_chunk(event)
                first = False
        if include_usage:
            yield fmt.sse(fmt.usage_chunk(rid, model, created, last, chat))
    except Exception as exc:  # mid-stream failure (engine shut down): say so, then end the stream
        yield fmt.sse(classify(exc).openai_body())
    yield fmt.SSE_DONE
