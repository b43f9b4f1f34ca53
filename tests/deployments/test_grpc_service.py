"""The gRPC surface on Ray Serve's proxy: Generation (raw stub) and the standard health service."""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from serving import ENGINE

from dspark import LLM, SamplingParams
from dspark_client.proto import GenerationStub, pb
from dspark_client.types import build_request


@pytest.fixture(scope="module")
def channel(serve_stack):
    with grpc.insecure_channel(serve_stack.grpc_target) as channel:
        yield channel


def test_health_service_answers_serving(channel):
    stub = health_pb2_grpc.HealthStub(channel)
    assert (
        stub.Check(health_pb2.HealthCheckRequest(), timeout=30).status
        == health_pb2.HealthCheckResponse.SERVING
    )
    named = health_pb2.HealthCheckRequest(service="dspark.v1.Generation")
    assert stub.Check(named, timeout=30).status == health_pb2.HealthCheckResponse.SERVING
    with pytest.raises(grpc.RpcError) as err:
        stub.Check(health_pb2.HealthCheckRequest(service="nope.Service"), timeout=30)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_health_watch_streams_the_status(channel):
    watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(), timeout=30)
    assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
    watch.cancel()


def test_generate_equals_offline_greedy(channel, serve_stack):
    prompt = "class TextWrapper:\n    "
    expected = LLM(str(serve_stack.model_dir), **ENGINE).generate(
        [prompt], SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    )[0]
    responses = list(
        GenerationStub(channel).Generate(
            build_request(prompt, temperature=0.0, max_tokens=24, ignore_eos=True, request_id="greedy-1"),
            timeout=60,
        )
    )
    deltas, final = responses[:-1], responses[-1]
    assert all(r.request_id == "greedy-1" for r in responses)
    assert [t for r in deltas for t in r.delta.token_ids] == expected.token_ids
    assert "".join(r.delta.text for r in deltas) == expected.text
    assert final.final.finish_reason == "length"
    assert final.final.usage.completion_tokens == 24 and final.final.speculation.rounds >= 1


def test_model_info_and_loads(channel, serve_stack):
    stub = GenerationStub(channel)
    info = stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=30)
    assert (info.model, info.max_model_len, info.drafter, info.num_replicas) == (
        serve_stack.model_name,
        512,
        "ngram",
        2,
    )
    loads = stub.GetLoads(pb.GetLoadsRequest(), timeout=30).replicas
    assert len(loads) == 2 and all(r.healthy and r.kv_total_pages == 128 for r in loads)
