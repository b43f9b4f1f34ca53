"""Overload is a 429 / RESOURCE_EXHAUSTED with a retry hint, on both surfaces: a full KV cache refuses
the newcomer, and so does a full ingress (deployments/ingress_admission.py)."""

from __future__ import annotations

import http.client
import json
from urllib.parse import urlparse

import pytest
from ray import serve
from serving import ENGINE, app_args, wait_until
from test_openai_http import raw_post

import dspark_client
from deployments.app import build_app

# 31 pages of 16 tokens: one running request of ~485 tokens leaves no room for a second.
SMALL_KV = {**ENGINE, "num_kv_pages": 31}


def assert_kv_full_is_a_429(stack, prefix: str = "", application: str = "") -> None:
    """While one stream holds every KV page of the app's only replica (engine SMALL_KV), a newcomer is
    refused by the engine: HTTP 429 with an OpenAI overloaded body, gRPC RESOURCE_EXHAUSTED with its
    retry hint naming the KV cache; the running stream is untouched."""
    with dspark_client.Client(
        stack.grpc_target, application=application, retry=dspark_client.NO_RETRY
    ) as client:
        holder = client.stream("def f(x):", max_tokens=480, temperature=1.0, ignore_eos=True)
        next(holder)  # admitted and running
        body = json.dumps({"prompt": "def g(y):", "max_tokens": 60}).encode()
        status, payload = raw_post(stack, prefix + "/v1/completions", body)
        assert status == 429 and payload["error"]["type"] == "overloaded_error", payload
        with pytest.raises(dspark_client.ResourceExhaustedError) as err:
            client.generate("def g(y):", max_tokens=60)
        assert err.value.retry_after_s == 1.0 and "KV cache exhausted" in err.value.message
        assert holder.completion is None  # still running: the refusals were about its blocks
        holder.cancel()


@pytest.mark.slow
def test_full_kv_cache_is_a_429_with_retry_hint(serve_stack):
    # The engine's own refusal, behind Serve's default router: the SLA router would refuse first, from
    # its predictions (tests/router/test_serve_router.py); this is the last line, for requests that
    # reach a full replica anyway (several ingress routers deciding at once).
    serve.run(
        build_app(app_args(serve_stack.model_dir, engine=SMALL_KV, num_replicas=1, router="pow2")),
        name="small",
        route_prefix="/small",
    )
    try:
        assert_kv_full_is_a_429(serve_stack, "/small", "small")
    finally:
        serve.delete("small")


# One stream running fills this app's ingress: 1 target replica x 1 request + 0 queued.
TIGHT = {"num_replicas": 1, "max_ongoing_requests": 1, "max_queued_requests": 0, "router": "pow2"}


def assert_ingress_full_is_a_429(http_url: str, grpc_target: str, prefix: str, application: str = "") -> None:
    """While one stream holds the only place of the app's ingress, HTTP gets 429 with Retry-After and
    an OpenAI body naming the ingress, gRPC RESOURCE_EXHAUSTED with its retry hint; once the stream is
    cancelled its place is free again."""
    with dspark_client.Client(grpc_target, application=application, retry=dspark_client.NO_RETRY) as client:
        holder = client.stream("def f(x):", max_tokens=480, temperature=1.0, ignore_eos=True)
        next(holder)  # admitted and running: the ingress' one place is taken
        body = json.dumps({"prompt": "def g(y):", "max_tokens": 4}).encode()
        conn = http.client.HTTPConnection(urlparse(http_url).netloc, timeout=30)
        conn.request(
            "POST", prefix + "/v1/completions", body=body, headers={"Content-Type": "application/json"}
        )
        response = conn.getresponse()
        payload = json.loads(response.read())
        conn.close()
        assert response.status == 429, payload
        assert response.getheader("Retry-After") == "1"  # nothing finished here yet: the floor
        error = payload["error"]
        assert error["type"] == "overloaded_error" and error["code"] == "overloaded"
        assert error["message"].startswith("ingress full: 1 requests in flight"), error
        with pytest.raises(dspark_client.ResourceExhaustedError) as err:
            client.generate("def g(y):", max_tokens=4)
        assert err.value.retry_after_s == 1.0 and err.value.message.startswith("ingress full"), err.value
        assert holder.completion is None  # untouched by the refusals
        holder.cancel()

        def admitted() -> bool:
            try:
                return (
                    client.generate("def g(y):", max_tokens=2, ignore_eos=True).usage.completion_tokens == 2
                )
            except dspark_client.ResourceExhaustedError:
                return False  # the cancelled stream's place is not back yet

        wait_until(admitted, timeout_s=60, what="the cancelled stream's place at the ingress")


@pytest.mark.slow
def test_full_ingress_is_a_429_with_retry_hint(serve_stack):
    serve.run(build_app(app_args(serve_stack.model_dir, **TIGHT)), name="tight", route_prefix="/tight")
    try:
        assert_ingress_full_is_a_429(serve_stack.http_url, serve_stack.grpc_target, "/tight", "tight")
    finally:
        serve.delete("tight")
