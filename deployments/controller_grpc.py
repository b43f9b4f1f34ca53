"""The controller's admin surface over gRPC (dspark.v1.ControllerAdmin), mixed into the Ingress beside
Generation: the same calls as the HTTP routes (deployments/controller_api.py), the same rule. The
caller's `authorization: Bearer <token>` metadata goes to the Controller, which checks it against its
own `admin_tokens` (UNAUTHENTICATED without one); bad input is INVALID_ARGUMENT naming the field.
"""

from __future__ import annotations

import asyncio
import json

from deployments.controller_api import ADMIN_TIMEOUT_S
from deployments.errors import NotFoundError
from deployments.grpc_api import _fail, _metadata
from dspark.errors import InvalidRequestError
from dspark_client.proto import admin_pb

DEFAULT_DECISIONS = 100


class ControllerAdminService:
    """Mixed into the Ingress, which holds the Controller's handle as `self.controller` (or None)."""

    async def GetControllerState(self, request, grpc_context) -> admin_pb.ControllerState:
        try:
            state = await self._ask_controller(grpc_context, "admin_state")
            return admin_pb.ControllerState(
                period=state["period"],
                period_s=state["period_s"],
                paused=state["paused"],
                errors=state["errors"],
                replicas=[
                    admin_pb.ReplicaControl(
                        replica_id=rid,
                        caps=caps_message(held["caps"]),
                        pinned=rid in state["pins"],
                        telemetry_json=json.dumps(held["telemetry"]),
                    )
                    for rid, held in sorted(state["replicas"].items())
                ],
                state_json=json.dumps(state),
            )
        except Exception as exc:
            raise _fail(grpc_context, exc) from None

    async def GetControllerDecisions(self, request, grpc_context) -> admin_pb.ControllerDecisions:
        try:
            limit = request.limit if request.HasField("limit") else DEFAULT_DECISIONS
            if limit < 0:
                raise InvalidRequestError("limit", f"must be >= 0, got {limit}")
            found = await self._ask_controller(grpc_context, "admin_decisions", limit)
            return admin_pb.ControllerDecisions(
                decisions=[
                    admin_pb.ControllerDecision(
                        replica_id=d["replica_id"],
                        period=d["period"],
                        reason=d["reason"],
                        changed=d["changed"],
                        rate_limited=d["rate_limited"],
                        caps=caps_message(d["caps"]),
                        previous=caps_message(d["previous"]),
                        inputs_json=json.dumps(d["inputs"]),
                    )
                    for d in found
                ]
            )
        except Exception as exc:
            raise _fail(grpc_context, exc) from None

    async def PinCaps(self, request, grpc_context) -> admin_pb.Caps:
        try:
            if not request.replica_id:
                raise InvalidRequestError("replica_id", "must not be empty")
            if not request.HasField("caps"):
                raise InvalidRequestError("caps", "must be set")
            pinned = await self._ask_controller(
                grpc_context, "admin_pin", request.replica_id, caps_dict(request.caps)
            )
            return caps_message(pinned)
        except Exception as exc:
            raise _fail(grpc_context, exc) from None

    async def UnpinCaps(self, request, grpc_context) -> admin_pb.UnpinCapsResponse:
        try:
            if not request.replica_id:
                raise InvalidRequestError("replica_id", "must not be empty")
            unpinned = await self._ask_controller(grpc_context, "admin_unpin", request.replica_id)
            return admin_pb.UnpinCapsResponse(unpinned=unpinned)
        except Exception as exc:
            raise _fail(grpc_context, exc) from None

    async def PauseController(self, request, grpc_context) -> admin_pb.PauseControllerResponse:
        try:
            paused = await self._ask_controller(grpc_context, "admin_pause", request.paused)
            return admin_pb.PauseControllerResponse(paused=paused)
        except Exception as exc:
            raise _fail(grpc_context, exc) from None

    async def _ask_controller(self, grpc_context, method: str, *args):
        if self.controller is None:
            raise NotFoundError("this application runs no controller (AppConfig.controller)")
        scheme, _, token = _metadata(grpc_context).get("authorization", "").partition(" ")
        token = token.strip() if scheme.lower() == "bearer" else None
        call = getattr(self.controller, method).remote(token, *args)
        return await asyncio.wait_for(call, ADMIN_TIMEOUT_S)


def caps_message(caps: dict) -> admin_pb.Caps:
    """Caps (controller/decision.py Caps.to_dict) as the message."""
    return admin_pb.Caps(
        max_step_tokens=caps.get("max_step_tokens"),
        max_request_tokens=caps.get("max_request_tokens"),
        by_class=caps.get("by_class") or {},
        drafting=caps.get("drafting", True),
        interactive_priority=caps.get("interactive_priority", False),
    )


def caps_dict(message: admin_pb.Caps) -> dict:
    """The message as the Controller's caps fields; unset optional fields stay unset (no cap)."""
    caps: dict = {"by_class": dict(message.by_class)}
    for name in ("max_step_tokens", "max_request_tokens", "drafting"):
        if message.HasField(name):
            caps[name] = getattr(message, name)
    for cls in caps["by_class"]:
        if not cls:
            raise InvalidRequestError("caps.by_class", "SLA class names must not be empty")
    return caps
