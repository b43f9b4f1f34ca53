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
