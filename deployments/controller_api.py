"""The controller's admin surface over HTTP, served by the ingress (the Controller is no HTTP ingress):

    GET    /admin/controller/state                   what it knows and holds per replica
    GET    /admin/controller/decisions?limit=N       its latest decisions, with reasons and evidence
    POST   /admin/controller/pin   {"replica_id", "caps": {max_step_tokens, ...}}
    DELETE /admin/controller/pin/{replica_id}
    POST   /admin/controller/pause {"paused": true | false}

Each call forwards the bearer token to the Controller, which checks it against its own `admin_tokens`
(not the API keys: clients of the model are not operators of the cluster).
"""

from __future__ import annotations

import asyncio
import json

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from ray import serve

from deployments.errors import NotFoundError, error_response
from dspark.errors import InvalidRequestError

router = APIRouter(prefix="/admin/controller")
ADMIN_TIMEOUT_S = 10.0  # a controller restarting answers 504 instead of holding the operator's call


async def _ask(method: str, *args):
    handle = _controller()
    return await asyncio.wait_for(getattr(handle, method).remote(*args), ADMIN_TIMEOUT_S)


def _controller():
    handle = serve.get_replica_context().servable_object.controller
    if handle is None:
        raise NotFoundError("this application runs no controller (AppConfig.controller)")
    return handle


def _token(request: Request) -> str | None:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else None


async def _json(request: Request) -> dict:
    try:
        body = json.loads(await request.body() or b"{}")
    except ValueError:
        raise InvalidRequestError("body", "must be a JSON object") from None
    if not isinstance(body, dict):
        raise InvalidRequestError("body", "must be a JSON object")
    return body


@router.get("/state")
async def state(request: Request) -> Response:
    try:
        return JSONResponse(await _ask("admin_state", _token(request)))
    except Exception as exc:
        return error_response(exc)


@router.get("/decisions")
async def decisions(request: Request, limit: int = 100) -> Response:
    try:
        return JSONResponse(await _ask("admin_decisions", _token(request), limit))
    except Exception as exc:
        return error_response(exc)


@router.post("/pin")
async def pin(request: Request) -> Response:
    try:
        body = await _json(request)
        replica_id, caps = body.get("replica_id"), body.get("caps")
        if not isinstance(replica_id, str):
            raise InvalidRequestError("replica_id", "must be a string")
        if not isinstance(caps, dict):
            raise InvalidRequestError("caps", "must be an object")
        return JSONResponse(await _ask("admin_pin", _token(request), replica_id, caps))
    except Exception as exc:
        return error_response(exc)


@router.delete("/pin/{replica_id}")
async def unpin(request: Request, replica_id: str) -> Response:
    try:
        return JSONResponse({"unpinned": await _ask("admin_unpin", _token(request), replica_id)})
    except Exception as exc:
        return error_response(exc)


@router.post("/pause")
async def pause(request: Request) -> Response:
    try:
        paused = (await _json(request)).get("paused")
        if not isinstance(paused, bool):
            raise InvalidRequestError("paused", "must be true or false")
        return JSONResponse({"paused": await _ask("admin_pause", _token(request), paused)})
    except Exception as exc:
        return error_response(exc)
