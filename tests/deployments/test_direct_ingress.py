"""Direct ingress (deployments/direct_ingress.py): the Ingress replica serves HTTP and gRPC on its own
ports, no Serve proxy in the path, and keeps every contract of the proxied surfaces: greedy identity,
400 / INVALID_ARGUMENT naming the field, 429 / RESOURCE_EXHAUSTED with a retry hint, health."""

from __future__ import annotations

import json
from urllib.parse import urlparse

import grpc
import openai
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from ray import serve
from serving import APP, Stack, app_args, own_stack
from test_admission import SMALL_KV, TIGHT, assert_ingress_full_is_a_429, assert_kv_full_is_a_429
from test_openai_http import raw_post

from deployments.app import build_app
from deployments.direct_ingress import LOCAL_DIRECT_INGRESS_ENV, endpoints_of, wait_for_endpoints
from dspark import LLM, SamplingParams
from dspark_client.proto import GenerationStub
from dspark_client.types import build_request

PROMPT = "def wrap(text, width):"


def test_endpoints_are_the_apps_own_replicas():
    groups = [
        {"protocol": "HTTP", "app_name": "", "targets": [{"ip": "10.0.0.1", "port": 8000}]},  # a proxy
        {"protocol": "HTTP", "app_name": "a", "targets": [{"ip": "10.0.0.2", "port": 30001}]},
        {"protocol": "HTTP", "app_name": "a", "targets": [{"ip": "10.0.0.1", "port": 30000}]},
        {"protocol": "gRPC", "app_name": "a", "targets": [{"ip": "10.0.0.1", "port": 40000}]},
        {"protocol": "RequestProtocol.GRPC", "app_name": "b", "targets": [{"ip": "10.0.0.3", "port": 1}]},
    ]
    found = endpoints_of(groups, "a")
    assert found.http == ("http://10.0.0.1:30000", "http://10.0.0.2:30001")
    assert found.grpc == ("10.0.0.1:40000",)
    assert endpoints_of(groups, "b").grpc == ("10.0.0.3:1",)
    assert endpoints_of(groups, "a", host="127.0.0.1").grpc == ("127.0.0.1:40000",)
    assert endpoints_of(groups, "c").http == ()


@pytest.fixture(scope="module")
def direct(qwen3_dir):
    """A stack of its own with direct ingress on: the Stack's addresses are the ingress replica's."""
    engine = {**SMALL_KV}
    overrides = {"engine": engine, "num_replicas": 1, "num_ingress_replicas": 1, "router": "pow2"}
    with own_stack(qwen3_dir, env=LOCAL_DIRECT_INGRESS_ENV, **overrides) as proxied:
        found = wait_for_endpoints(APP, replicas=1, host="127.0.0.1")
        stack = Stack(found.http[0], found.grpc[0], proxied.model_dir, proxied.model_name)
        assert stack.http_url != proxied.http_url and stack.grpc_target != proxied.grpc_target
        yield stack


@pytest.fixture(scope="module")
def expected(direct):
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    return LLM(str(direct.model_dir), **SMALL_KV).generate([PROMPT], params)[0]


@pytest.mark.slow
def test_http_stream_equals_offline_greedy(direct, expected):
    client = openai.OpenAI(base_url=direct.http_url + "/v1", api_key="-", max_retries=0, timeout=60)
    chunks = list(
        client.completions.create(
            model=direct.model_name,
            prompt=PROMPT,
            max_tokens=20,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == expected.text
    assert chunks[-1].usage.completion_tokens == 20


@pytest.mark.slow
def test_grpc_stream_equals_offline_greedy(direct, expected):
    with grpc.insecure_channel(direct.grpc_target) as channel:
        request = build_request(PROMPT, temperature=0.0, max_tokens=20, ignore_eos=True, request_id="di-1")
        responses = list(GenerationStub(channel).Generate(request, timeout=60))
    deltas, final = responses[:-1], responses[-1]
    assert all(r.request_id == "di-1" for r in responses)
    assert [t for r in deltas for t in r.delta.token_ids] == expected.token_ids
    assert final.final.finish_reason == "length" and final.final.usage.completion_tokens == 20


@pytest.mark.slow
def test_bad_input_names_the_field_on_both_surfaces(direct):
    body = json.dumps({"prompt": "x", "max_tokens": 4, "temperature": -1}).encode()
    status, payload = raw_post(direct, "/v1/completions", body)
    assert status == 400 and payload["error"]["param"] == "temperature", payload
    with grpc.insecure_channel(direct.grpc_target) as channel:
        stream = GenerationStub(channel).Generate(build_request(prompt="x", top_p=1.5), timeout=30)
        with pytest.raises(grpc.RpcError) as err:
            list(stream)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith("top_p: ")


@pytest.mark.slow
def test_full_kv_cache_is_a_429_with_retry_hint(direct):
    assert_kv_full_is_a_429(direct)


@pytest.mark.slow
def test_full_ingress_is_a_429_with_retry_hint(direct):
    # An app of its own, whose ingress replica gets direct ports of its own too.
    serve.run(build_app(app_args(direct.model_dir, **TIGHT)), name="tight", route_prefix="/tight")
    try:
        found = wait_for_endpoints("tight", replicas=1, host="127.0.0.1")
        assert_ingress_full_is_a_429(found.http[0], found.grpc[0], "/tight")
    finally:
        serve.delete("tight")


@pytest.mark.slow
def test_health_on_both_surfaces(direct):
    import http.client

    conn = http.client.HTTPConnection(urlparse(direct.http_url).netloc, timeout=30)
    conn.request("GET", "/health")
    assert conn.getresponse().status == 200
    with grpc.insecure_channel(direct.grpc_target) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=30)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
