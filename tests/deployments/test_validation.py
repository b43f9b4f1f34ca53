"""Edge validation (pure): every bad input is an InvalidRequestError naming its field."""

from __future__ import annotations

import json

import pytest

from deployments.validation import Limits, chat_request, completion_request, grpc_request, parse_json_body
from dspark.errors import InvalidRequestError
from dspark_client.types import build_request

LIMITS = Limits(max_request_bytes=4096)


def completion(**body):
    return completion_request({"model": "m", "prompt": "hi", **body}, LIMITS)


@pytest.mark.parametrize(
    "body, field",
    [
        ({"prompt": ""}, "prompt"),
        ({"prompt": []}, "prompt"),
        ({"prompt": None}, "prompt"),
        ({"prompt": 5}, "prompt"),
        ({"prompt": ["a", "b"]}, "prompt"),
        ({"prompt": [1, "x"]}, "prompt"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": -3}, "max_tokens"),
        ({"max_tokens": "10"}, "max_tokens"),
        ({"max_tokens": 2.5}, "max_tokens"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": 1.5}, "top_k"),
        ({"model": 7}, "model"),
        ({"stream": "yes"}, "stream"),
        ({"stop": 3}, "stop"),
        ({"stop": ["ok", 3]}, "stop"),
        ({"stop": [""]}, "stop"),
        ({"stop": ["x"] * 17}, "stop"),
        ({"seed": "s"}, "seed"),
        ({"n": 2}, "n"),
        ({"logprobs": 3}, "logprobs"),
        ({"stream_options": []}, "stream_options"),
    ],
)
def test_completion_refusals_name_the_field(body, field):
    with pytest.raises(InvalidRequestError) as err:
        completion(**body)
    assert err.value.field == field


def test_completion_accepts_openai_shapes():
    req = completion(prompt=["one prompt"], max_tokens=5, temperature=0, stop="\n", stream=True)
    assert req.prompt == "one prompt" and req.params.max_tokens == 5 and req.params.stop == ("\n",)
    assert completion(prompt=[[1, 2, 3]]).prompt_token_ids == [1, 2, 3]
    assert completion(max_tokens=None, n=1, logprobs=None).params.max_tokens == 16


@pytest.mark.parametrize(
    "raw, message",
    [(b"{not json", "not valid JSON"), (b"[1, 2]", "JSON object"), (b"\xff\xfe", "not valid JSON")],
)
def test_malformed_bodies(raw, message):
    with pytest.raises(InvalidRequestError, match=message) as err:
        parse_json_body(raw, LIMITS)
    assert err.value.field == "body"


def test_oversized_body():
    with pytest.raises(InvalidRequestError, match="exceed the limit") as err:
        parse_json_body(json.dumps({"prompt": "x" * 5000}).encode(), LIMITS)
    assert err.value.field == "body"


@pytest.mark.parametrize(
    "messages, field",
    [
        ([], "messages"),
        ("hi", "messages"),
        ([{"role": "wizard", "content": "x"}], "messages[0].role"),
        ([{"role": "user", "content": 5}], "messages[0].content"),
        ([{"role": "user", "content": [{"type": "image_url"}]}], "messages[0].content[0]"),
        ([{"role": "user", "content": ""}], "messages"),
        (["hi"], "messages[0]"),
    ],
)
def test_chat_refusals_name_the_field(messages, field):
    with pytest.raises(InvalidRequestError) as err:
        chat_request({"model": "m", "messages": messages}, LIMITS)
    assert err.value.field == field


def test_chat_takes_max_completion_tokens():
    req = chat_request({"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 7}, LIMITS)
    assert req.params.max_tokens == 7 and req.messages == [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"prompt": ""}, "prompt"),
        ({"prompt": "x", "prompt_token_ids": [1]}, "prompt"),
        ({"prompt": "x" * 5000}, "prompt"),
        ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
        ({"prompt": "x", "temperature": -1.0}, "temperature"),
        ({"prompt": "x", "top_p": 0.0}, "top_p"),
        ({"prompt": "x", "top_p": 1.01}, "top_p"),
        ({"prompt": "x", "stop_token_ids": [-1]}, "stop_token_ids"),
    ],
)
def test_grpc_refusals_name_the_field(kwargs, field):
    with pytest.raises(InvalidRequestError) as err:
        grpc_request(build_request(**kwargs), LIMITS)
    assert err.value.field == field


def test_grpc_unset_options_take_defaults():
    req = grpc_request(build_request("hi", request_id="r1"), LIMITS)
    assert req.params.temperature == 1.0 and req.params.max_tokens == 16 and req.request_id == "r1"
    assert grpc_request(build_request("hi", temperature=0.0), LIMITS).params.greedy
