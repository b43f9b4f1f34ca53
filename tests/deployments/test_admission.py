"""A full KV cache refuses the newcomer with 429 / RESOURCE_EXHAUSTED and a retry hint, on both surfaces."""

from __future__ import annotations

import json

import pytest
from ray import serve
from serving import ENGINE, app_args
from test_openai_http import raw_post

import dspark_client
from deployments.app import build_app


@pytest.mark.slow
def test_full_kv_cache_is_a_429_with_retry_hint(serve_stack):
    # 31 blocks of 16 tokens: one running request of ~485 tokens leaves no room for a second.
    engine = {**ENGINE, "num_kv_pages": 31}
    # The engine's own refusal, behind Serve's default router: the SLA router would refuse first, from
    # its predictions (tests/router/test_serve_router.py); this is the last line, for requests that
    # reach a full replica anyway (several ingress routers deciding at once).
    serve.run(
        build_app(app_args(serve_stack.model_dir, engine=engine, num_replicas=1, router="pow2")),
        name="small",
        route_prefix="/small",
    )
    try:
        with dspark_client.Client(
            serve_stack.grpc_target, application="small", retry=dspark_client.NO_RETRY
        ) as client:
            holder = client.stream("def f(x):", max_tokens=480, temperature=1.0, ignore_eos=True)
            next(holder)  # admitted and running
            body = json.dumps({"prompt": "def g(y):", "max_tokens": 60}).encode()
            status, payload = raw_post(serve_stack, "/small/v1/completions", body)
            assert status == 429 and payload["error"]["type"] == "overloaded_error", payload
            with pytest.raises(dspark_client.ResourceExhaustedError) as err:
                client.generate("def g(y):", max_tokens=60)
            assert err.value.retry_after_s == 1.0 and "KV cache exhausted" in err.value.message
            assert holder.completion is None  # still running: the refusals were about its blocks
            holder.cancel()
    finally:
        serve.delete("small")
