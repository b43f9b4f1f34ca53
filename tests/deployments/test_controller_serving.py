"""The cluster controller in a real Ray Serve app (deployments/controller.py): it reads the replicas every
period, caps pinned through its admin surface reach exactly the replica they name, greedy output stays
the target's, replicas keep their caps while the controller is down, and a restarted controller
rebuilds its state from what the replicas hold instead of resetting them.

The app's replicas draft with n-grams (no confidences, so no cost table): the policy sees no evidence
and holds, which leaves what the admin pins as the only source of caps, and makes every outcome exact.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import grpc
import pytest
import ray
from ray import serve
from serving import ENGINE, app_args, wait_until

from deployments.app import build_app
from deployments.replicas import SERVE_NAMESPACE, replica_actor_names
from dspark import LLM, SamplingParams
from dspark_client.proto import ControllerAdminStub, admin_pb

APP = "ctl"
TOKEN = "operator-secret"
PROMPT = "def wrap(text, width):"
DEFAULT_BUDGET = {
    "max_step_tokens": None,
    "max_request_tokens": None,
    "max_request_tokens_by_class": {},
    "max_step_s": None,
}


def call(url: str, method: str, path: str, body: dict | None = None, token: str | None = TOKEN):
    request = urllib.request.Request(
        f"{url}/{APP}/admin/controller{path}",
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers={"Content-Type": "application/json"}
        | ({"Authorization": f"Bearer {token}"} if token else {}),
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def complete(url: str) -> str:
    body = {"model": "target", "prompt": PROMPT, "max_tokens": 24, "temperature": 0, "ignore_eos": True}
    request = urllib.request.Request(
        f"{url}/{APP}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())["choices"][0]["text"]


def rpc(channel, method: str, request, token: str | None = TOKEN):
    """One ControllerAdmin call to this app (Serve's gRPC proxy picks the app by `application`)."""
    metadata = [("application", APP)] + ([("authorization", f"Bearer {token}")] if token else [])
    return getattr(ControllerAdminStub(channel), method)(request, metadata=metadata, timeout=30)


def rpc_error(channel, method: str, request, token: str | None = TOKEN) -> tuple:
    with pytest.raises(grpc.RpcError) as err:
        rpc(channel, method, request, token)
    return err.value.code(), err.value.details()


@pytest.fixture(scope="module")
def controlled(serve_stack):
    # No collapse threshold: whatever the random test model's n-gram acceptance, drafting stays on.
    controller = {"period_s": 1.0, "admin_tokens": [TOKEN], "policy": {"collapse_acceptance": 0.0}}
    args = app_args(serve_stack.model_dir, controller=controller)
    serve.run(build_app(args), name=APP, route_prefix=f"/{APP}")
    try:
        yield serve_stack.http_url
    finally:
        serve.delete(APP)


def state(url: str) -> dict:
    status, body = call(url, "GET", "/state")
    assert status == 200, body
    return body


def ready_state(url: str) -> dict | None:
    """The state, or None while the controller restarts (the ingress answers 504 then)."""
    status, body = call(url, "GET", "/state")
    assert status in (200, 503, 504), body
    return body if status == 200 else None


def test_admin_surface_requires_the_operators_token(controlled):
    assert call(controlled, "GET", "/state", token=None)[0] == 401
    assert call(controlled, "GET", "/state", token="wrong")[0] == 401
    status, body = call(controlled, "POST", "/pause", {"paused": "yes"})
    assert status == 400 and body["error"]["param"] == "paused"


def test_caps_reach_the_named_replica_and_greedy_output_is_unchanged(controlled, serve_stack):
    replicas = wait_until(lambda: len(state(controlled)["replicas"]) == 2 and state(controlled)["replicas"])
    first, second = sorted(replicas)
    decisions = wait_until(lambda: call(controlled, "GET", "/decisions?limit=4")[1], what="decisions")
    assert {d["reason"] for d in decisions} == {"no_evidence"}  # n-grams: no cost table, nothing to judge

    caps = {"max_step_tokens": 1, "max_step_s": 0.05}
    status, body = call(controlled, "POST", "/pin", {"replica_id": first, "caps": caps})
    assert status == 200 and body["max_step_tokens"] == 1 and body["max_step_s"] == 0.05
    pinned = {**DEFAULT_BUDGET, **caps}
    wait_until(
        lambda: state(controlled)["replicas"][first]["telemetry"]["budget"] == pinned,
        what="the pinned cap on the replica",
    )
    assert state(controlled)["replicas"][second]["telemetry"]["budget"] == DEFAULT_BUDGET

    status, body = call(controlled, "POST", "/pin", {"replica_id": "nope", "caps": {}})
    assert status == 404
    status, body = call(controlled, "POST", "/pin", {"replica_id": first, "caps": {"max_step_tokens": -1}})
    assert status == 400 and body["error"]["param"] == "max_step_tokens"
    status, body = call(controlled, "POST", "/pin", {"replica_id": first, "caps": {"max_step_s": 0}})
    assert status == 400 and body["error"]["param"] == "max_step_s"

    expected = LLM(str(serve_stack.model_dir), **ENGINE).generate(
        [PROMPT], SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    )[0]
    assert {complete(controlled) for _ in range(4)} == {expected.text}  # whichever replica serves it

    # Down: the replicas keep their caps. Restarted by Serve: it starts from what they hold.
    (name,) = replica_actor_names(APP, "Controller")
    ray.kill(ray.get_actor(name, namespace=SERVE_NAMESPACE), no_restart=True)
    wait_until(
        lambda: replica_actor_names(APP, "Controller") not in ([], [name]), timeout_s=120, what="restart"
    )
    after = wait_until(
        lambda: (s := ready_state(controlled)) and s["period"] >= 2 and len(s["replicas"]) == 2 and s,
        timeout_s=120,
        what="the restarted controller's periods",
    )
    assert after["pins"] == {}  # pins lived in the old process
    assert after["replicas"][first]["telemetry"]["budget"] == pinned
    assert after["replicas"][first]["caps"]["max_step_tokens"] == 1  # adopted, not reset to defaults


def test_pause_stops_pushes_and_unpin_lets_the_policy_decide(controlled):
    replicas = wait_until(lambda: len(state(controlled)["replicas"]) == 2 and state(controlled)["replicas"])
    rid = sorted(replicas)[1]
    assert call(controlled, "POST", "/pause", {"paused": True}) == (200, {"paused": True})
    call(controlled, "POST", "/pin", {"replica_id": rid, "caps": {"max_request_tokens": 2}})
    period = state(controlled)["period"]
    wait_until(lambda: state(controlled)["period"] >= period + 2, what="two paused periods")
    assert state(controlled)["replicas"][rid]["telemetry"]["budget"]["max_request_tokens"] is None
    assert call(controlled, "POST", "/pause", {"paused": False}) == (200, {"paused": False})
    wait_until(
        lambda: state(controlled)["replicas"][rid]["telemetry"]["budget"]["max_request_tokens"] == 2,
        what="the pin pushed after resuming",
    )
    assert call(controlled, "DELETE", f"/pin/{rid}") == (200, {"unpinned": True})


def test_grpc_admin_surface_same_rule_as_http(controlled, serve_stack):
    with grpc.insecure_channel(serve_stack.grpc_target) as channel:
        for token in (None, "wrong"):
            code, _ = rpc_error(channel, "GetControllerState", admin_pb.GetControllerStateRequest(), token)
            assert code == grpc.StatusCode.UNAUTHENTICATED
        code, _ = rpc_error(channel, "PauseController", admin_pb.PauseControllerRequest(paused=True), None)
        assert code == grpc.StatusCode.UNAUTHENTICATED

        state_of = lambda: rpc(channel, "GetControllerState", admin_pb.GetControllerStateRequest())  # noqa: E731
        replicas = wait_until(lambda: len(state_of().replicas) == 2 and state_of().replicas)
        rid = replicas[0].replica_id
        assert json.loads(state_of().state_json)["period_s"] == 1.0

        bad = [
            ("GetControllerDecisions", admin_pb.GetControllerDecisionsRequest(limit=-1), "limit"),
            ("PinCaps", admin_pb.PinCapsRequest(caps=admin_pb.Caps(max_step_tokens=1)), "replica_id"),
            ("PinCaps", admin_pb.PinCapsRequest(replica_id=rid), "caps"),
            (
                "PinCaps",
                admin_pb.PinCapsRequest(replica_id=rid, caps=admin_pb.Caps(max_step_tokens=-2)),
                "max_step_tokens",
            ),
            ("UnpinCaps", admin_pb.UnpinCapsRequest(), "replica_id"),
        ]
        for method, request, field in bad:
            code, details = rpc_error(channel, method, request)
            assert code == grpc.StatusCode.INVALID_ARGUMENT and field in details, (method, details)
        code, _ = rpc_error(
            channel, "PinCaps", admin_pb.PinCapsRequest(replica_id="nope", caps=admin_pb.Caps())
        )
        assert code == grpc.StatusCode.NOT_FOUND

        pinned = rpc(
            channel,
            "PinCaps",
            admin_pb.PinCapsRequest(replica_id=rid, caps=admin_pb.Caps(max_request_tokens=3)),
        )
        assert pinned.max_request_tokens == 3 and not pinned.HasField("max_step_tokens")
        wait_until(
            lambda: (
                json.loads(next(r for r in state_of().replicas if r.replica_id == rid).telemetry_json)[
                    "budget"
                ]["max_request_tokens"]
                == 3
            ),
            what="the cap pinned over gRPC on the replica",
        )
        assert next(r for r in state_of().replicas if r.replica_id == rid).pinned
        decisions = rpc(channel, "GetControllerDecisions", admin_pb.GetControllerDecisionsRequest(limit=2))
        assert len(decisions.decisions) == 2 and all(d.reason for d in decisions.decisions)
        assert rpc(channel, "UnpinCaps", admin_pb.UnpinCapsRequest(replica_id=rid)).unpinned
        assert not rpc(channel, "UnpinCaps", admin_pb.UnpinCapsRequest(replica_id=rid)).unpinned
        assert rpc(channel, "PauseController", admin_pb.PauseControllerRequest(paused=True)).paused
        assert state_of().paused
        assert not rpc(channel, "PauseController", admin_pb.PauseControllerRequest(paused=False)).paused
