"""Bad inputs on both surfaces: HTTP 400 / INVALID_ARGUMENT naming the field, never 500 or a hung stream."""

from __future__ import annotations

import json

import grpc
import openai
import pytest
from test_openai_http import raw_post

from dspark_client.proto import GenerationStub
from dspark_client.types import build_request

GOOD = {"prompt": "def f(x):", "max_tokens": 4}


@pytest.mark.parametrize(
    "body, field",
    [
        ({**GOOD, "prompt": ""}, "prompt"),
        ({**GOOD, "model": "no-such-model"}, "model"),
        ({**GOOD, "max_tokens": 0}, "max_tokens"),
        ({**GOOD, "max_tokens": 100000}, "max_tokens"),
        ({**GOOD, "temperature": -1}, "temperature"),
        ({**GOOD, "top_p": 0}, "top_p"),
        ({**GOOD, "top_p": 2}, "top_p"),
        ({**GOOD, "max_tokens": "four"}, "max_tokens"),
        ({**GOOD, "prompt": {"text": "x"}}, "prompt"),
        ({**GOOD, "prompt": [1, 2, 99999]}, "prompt"),
        ({**GOOD, "prompt": "word " * 600}, "prompt"),  # longer than the context
        ({**GOOD, "stream": True, "max_tokens": -1}, "max_tokens"),  # refused before any SSE starts
    ],
)
def test_http_bad_inputs(serve_stack, body, field):
    status, payload = raw_post(serve_stack, "/v1/completions", json.dumps(body).encode())
    assert status == 400, payload
    assert payload["error"]["param"] == field and field in payload["error"]["message"]


@pytest.mark.parametrize(
    "raw, field",
    [(b"{oops", "body"), (b"[]", "body"), (b'"text"', "body"), (b"x" * (65 * 1024), "body")],
)
def test_http_malformed_and_oversized_bodies(serve_stack, raw, field):
    status, payload = raw_post(serve_stack, "/v1/completions", raw)
    assert status == 400 and payload["error"]["param"] == field


def test_http_chat_bad_messages(serve_stack):
    body = {"messages": [{"role": "user", "content": 3}], "max_tokens": 4}
    status, payload = raw_post(serve_stack, "/v1/chat/completions", json.dumps(body).encode())
    assert status == 400 and payload["error"]["param"] == "messages[0].content"


def test_openai_client_sees_bad_request(serve_stack):
    client = openai.OpenAI(base_url=serve_stack.http_url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=serve_stack.model_name, prompt="x", max_tokens=4, top_p=1.5)
    assert err.value.body["param"] == "top_p"


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"prompt": ""}, "prompt"),
        ({"prompt": "x", "model": "no-such-model"}, "model"),
        ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
        ({"prompt": "x", "max_tokens": 100000}, "max_tokens"),
        ({"prompt": "x", "temperature": -0.5}, "temperature"),
        ({"prompt": "x", "top_p": 0.0}, "top_p"),
        ({"prompt": "x", "top_p": 1.5}, "top_p"),
        ({"prompt_token_ids": [1, 99999]}, "prompt_token_ids"),
        ({"prompt": "x" * (65 * 1024)}, "prompt"),
    ],
)
def test_grpc_bad_inputs(serve_stack, kwargs, field):
    with grpc.insecure_channel(serve_stack.grpc_target) as channel:
        stream = GenerationStub(channel).Generate(build_request(**kwargs), timeout=30)
        with pytest.raises(grpc.RpcError) as err:
            list(stream)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith(f"{field}: ")


CMPL, CHAT = "/v1/completions", "/v1/chat/completions"
USER_SURROGATE = rb'{"messages": [{"role": "user", "content": "\udcff"}]}'
PART_NOT_TEXT = rb'{"messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]}'


@pytest.mark.parametrize(
    "path, raw, field, words",
    [
        (CMPL, rb'{"prompt": "\udcff\u0000\u202e"}', "prompt", "lone surrogate"),
        (CMPL, b'{"prompt": "\xed\xb3\xbf"}', "body", "not valid UTF-8"),
        (CMPL, b"[" * 60_000, "body", "nesting deeper than 32 levels"),  # under the 64 KiB limit
        (CMPL, b'{"prompt": "x", "temperature": Infinity}', "body", "Infinity is not valid JSON"),
        (CMPL, b'{"prompt": "x", "temperature": 1e308}', "temperature", "less than or equal to 2"),
        (CMPL, b'{"prompt": "x", "seed": 18446744073709551616}', "seed", "9223372036854775807"),
        (CMPL, b'{"prompt": "x", "seed": 1' + b"0" * 5000 + b"}", "body", "5001 digits"),
        (CMPL, b'{"prompt": "x", "request_id": "' + b"r" * 129 + b'"}', "request_id", "128"),
        (CMPL, b'{"prompt": "x", "sla_class": "' + b"s" * 65 + b'"}', "sla_class", "64"),
        (CMPL, b'{"prompt": "x", "stop": ["' + b"s" * 257 + b'"]}', "stop[0]", "256"),
        (CMPL, rb'{"prompt": "x", "model": "\ud800"}', "model", "lone surrogate"),
        (CHAT, USER_SURROGATE, "messages[0].content", "lone surrogate"),
        (CHAT, PART_NOT_TEXT, "messages[0].content[0].text", "must be a string"),
    ],
)
def test_http_hostile_bodies_are_refused_by_field(serve_stack, path, raw, field, words):
    status, payload = raw_post(serve_stack, path, raw)
    assert status == 400, payload
    assert payload["error"]["param"] == field and words in payload["error"]["message"], payload


@pytest.mark.parametrize(
    "path, body",
    [
        (CMPL, {"prompt": "a\x00b\u202ec\u200f", "temperature": 1e-300, "top_p": 5e-324}),
        (CMPL, {"prompt": "x" * 300, "seed": -(2**63), "temperature": 0.5}),
        (
            CHAT,
            {"messages": [{"role": "tool", "content": [{"type": "text", "text": t} for t in ("", "\x00")]}]},
        ),
    ],
)
def test_http_odd_but_valid_bodies_generate(serve_stack, path, body):
    status, payload = raw_post(serve_stack, path, json.dumps({**body, "max_tokens": 3}).encode())
    assert status == 200, payload
    assert payload["usage"]["completion_tokens"] >= 1


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"prompt": "x", "temperature": float("nan")}, "temperature"),
        ({"prompt": "x", "top_p": float("inf")}, "top_p"),
        ({"prompt": "x", "request_id": "r" * 129}, "request_id"),
        ({"prompt": "x", "stop": ["s"] * 17}, "stop"),
        ({"prompt": "x", "stop_token_ids": [-3]}, "stop_token_ids[0]"),
        ({"prompt": "x", "sla_class": "s p"}, "sla_class"),
    ],
)
def test_grpc_hostile_values_are_refused_by_field(serve_stack, kwargs, field):
    with grpc.insecure_channel(serve_stack.grpc_target) as channel:
        stream = GenerationStub(channel).Generate(build_request(**kwargs), timeout=30)
        with pytest.raises(grpc.RpcError) as err:
            list(stream)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith(f"{field}: ")


def test_grpc_values_the_sampler_cannot_represent_still_generate(serve_stack):
    request = build_request("def f(x):", temperature=5e-324, top_p=1e-300, seed=-(2**63), max_tokens=3)
    with grpc.insecure_channel(serve_stack.grpc_target) as channel:
        responses = list(GenerationStub(channel).Generate(request, timeout=30))
    assert responses[-1].final.usage.completion_tokens >= 1
