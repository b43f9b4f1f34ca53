"""Edge validation (pure): the request schemas on both surfaces; every refusal names its field."""

from __future__ import annotations

import pytest

from deployments.validation import Limits, chat_request, completion_request, grpc_request
from dspark.errors import InvalidRequestError
from dspark_client.proto import pb
from dspark_client.types import build_request

LIMITS = Limits(max_request_bytes=4096)
INT64_MAX = 2**63 - 1


def completion(**body):
    return completion_request({"model": "m", "prompt": "hi", **body}, LIMITS)


def chat(messages, **body):
    return chat_request({"model": "m", "messages": messages, **body}, LIMITS)


def user(content) -> dict:
    return {"role": "user", "content": content}


def refusal(call, *args, **kwargs) -> InvalidRequestError:
    with pytest.raises(InvalidRequestError) as err:
        call(*args, **kwargs)
    assert err.value.message.isascii()  # quotes the client's value escaped, never raw
    return err.value


@pytest.mark.parametrize(
    "body, field, words",
    [
        ({"prompt": ""}, "prompt", "at least 1 character"),
        ({"prompt": []}, "prompt", "at least 1 item"),
        ({"prompt": None}, "prompt", "must be a string or an array of token ids"),
        ({"prompt": 5}, "prompt", "must be a string or an array of token ids (got 5)"),
        ({"prompt": {"text": "x"}}, "prompt", "(got an object)"),
        ({"prompt": ["a", "b"]}, "prompt", "only one prompt per request"),
        ({"prompt": [1, "x"]}, "prompt[1]", "must be an integer (got 'x')"),
        ({"prompt": [1, True]}, "prompt[1]", "must be an integer (got True)"),
        ({"prompt": [1, -1]}, "prompt[1]", "greater than or equal to 0"),
        ({"prompt": [2**31]}, "prompt[0]", "less than or equal to 2147483647"),
        ({"prompt": "\udcff\x00\u202e"}, "prompt", "lone surrogate"),
        ({"max_tokens": 0}, "max_tokens", "greater than or equal to 1 (got 0)"),
        ({"max_tokens": -3}, "max_tokens", "(got -3)"),
        ({"max_tokens": "10"}, "max_tokens", "must be an integer (got '10')"),
        ({"max_tokens": 2.5}, "max_tokens", "must be an integer"),
        ({"max_tokens": 16.0}, "max_tokens", "must be an integer"),
        ({"max_tokens": 10**30}, "max_tokens", "less than or equal to 1048576"),
        ({"temperature": -0.1}, "temperature", "greater than or equal to 0"),
        ({"temperature": "hot"}, "temperature", "must be a number (got 'hot')"),
        ({"temperature": 2.5}, "temperature", "less than or equal to 2"),
        ({"temperature": 1e308}, "temperature", "(got 1e+308)"),
        ({"temperature": float("inf")}, "temperature", "must be a finite number"),
        ({"temperature": float("nan")}, "temperature", "must be a finite number"),
        ({"temperature": True}, "temperature", "must be a number (got True)"),
        ({"top_p": 0}, "top_p", "greater than 0"),
        ({"top_p": -0.0}, "top_p", "greater than 0"),
        ({"top_p": 1.5}, "top_p", "less than or equal to 1"),
        ({"top_k": 1.5}, "top_k", "must be an integer"),
        ({"top_k": -2}, "top_k", "greater than or equal to -1"),
        ({"seed": "s"}, "seed", "must be an integer"),
        ({"seed": 2**63}, "seed", "less than or equal to 9223372036854775807"),
        ({"seed": -(2**63) - 1}, "seed", "greater than or equal to -9223372036854775808"),
        ({"model": 7}, "model", "must be a string (got 7)"),
        ({"model": "m" * 257}, "model", "at most 256 characters (got a string of 257 characters)"),
        ({"model": "\ud800"}, "model", "lone surrogate"),
        ({"stream": "yes"}, "stream", "must be a boolean"),
        ({"stream": 1}, "stream", "must be a boolean (got 1)"),
        ({"stream_options": []}, "stream_options", "must be an object"),
        ({"stream_options": {"include_usage": "yes"}}, "stream_options.include_usage", "boolean"),
        ({"stop": 3}, "stop", "must be a string or an array of strings (got 3)"),
        ({"stop": ["ok", 3]}, "stop[1]", "must be a string (got 3)"),
        ({"stop": [""]}, "stop[0]", "at least 1 character"),
        ({"stop": ""}, "stop", "at least 1 character"),
        ({"stop": ["x"] * 17}, "stop", "at most 16 items"),
        ({"stop": "x" * 257}, "stop", "at most 256 characters"),
        ({"stop": ["ok", "\udfff"]}, "stop[1]", "lone surrogate"),
        ({"stop_token_ids": 5}, "stop_token_ids", "must be an array"),
        ({"stop_token_ids": [1] * 65}, "stop_token_ids", "at most 64 items"),
        ({"stop_token_ids": [-1]}, "stop_token_ids[0]", "greater than or equal to 0"),
        ({"ignore_eos": "true"}, "ignore_eos", "must be a boolean"),
        ({"include_stop_str_in_output": 0}, "include_stop_str_in_output", "must be a boolean"),
        ({"request_id": ""}, "request_id", "at least 1 character"),
        ({"request_id": "r" * 129}, "request_id", "at most 128 characters"),
        ({"request_id": "a b"}, "request_id", "only letters, digits"),
        ({"request_id": "r\n1"}, "request_id", "only letters, digits"),
        ({"request_id": "r\udcff"}, "request_id", "valid Unicode"),
        ({"request_id": 7}, "request_id", "must be a string"),
        ({"sla_class": "s" * 65}, "sla_class", "at most 64 characters"),
        ({"sla_class": "batch\u202e"}, "sla_class", "only letters, digits"),
        ({"n": 2}, "n", "not supported by this server: only 1 is accepted (got 2)"),
        ({"n": True}, "n", "not supported"),
        ({"best_of": 3}, "best_of", "not supported"),
        ({"echo": True}, "echo", "not supported"),
        ({"logprobs": 3}, "logprobs", "only False or 0 is accepted"),
        ({"top_logprobs": 2}, "top_logprobs", "not supported"),
        ({"presence_penalty": 0.5}, "presence_penalty", "not supported"),
        ({"frequency_penalty": -1}, "frequency_penalty", "not supported"),
        ({"suffix": "x"}, "suffix", "not supported"),
        ({"logit_bias": {"1": 5}}, "logit_bias", "only {} is accepted (got an object)"),
        ({"tools": [{}]}, "tools", "only [] is accepted (got an array of 1 items)"),
    ],
)
def test_completion_refusals_name_the_field(body, field, words):
    err = refusal(completion, **body)
    assert err.field == field and words in err.message, err


def test_several_errors_report_the_first_and_count_the_rest():
    err = refusal(completion, max_tokens=0, top_p=2, seed="x")
    assert err.field == "max_tokens" and err.message.endswith("; and 2 more errors")


def test_long_values_are_described_not_echoed():
    err = refusal(completion, temperature="x" * 10_000)
    assert err.message == "must be a number (got a string of 10000 characters)"


def test_completion_accepts_openai_shapes():
    req = completion(prompt=["one prompt"], max_tokens=5, temperature=0, stop="\n", stream=True)
    assert req.prompt == "one prompt" and req.params.max_tokens == 5 and req.params.stop == ("\n",)
    assert req.stream and not req.include_usage and req.params.greedy
    assert completion(prompt=[[1, 2, 3]]).prompt_token_ids == [1, 2, 3]
    assert completion(prompt=[0, 2**31 - 1]).prompt_token_ids == [0, 2**31 - 1]
    assert completion(max_tokens=None, n=1, logprobs=None).params.max_tokens == 16


def test_neutral_values_and_nulls_are_accepted():
    neutral = dict(
        n=1, best_of=1, echo=False, logprobs=0, top_logprobs=0, presence_penalty=0.0, frequency_penalty=0,
        suffix="", logit_bias={}, tools=[],
    )  # fmt: skip
    assert completion(**neutral).params == completion().params
    nulls = {name: None for name in ("temperature", "top_p", "top_k", "seed", "stop", "stop_token_ids")}
    nulls |= {"ignore_eos": None, "stream": None, "stream_options": None, "request_id": None}
    req = completion(**nulls)
    assert req.params == completion().params and not req.stream and req.request_id is None


def test_every_option_reaches_sampling_params():
    req = completion(
        prompt="x", max_tokens=9, temperature=0.7, top_p=0.9, top_k=5, seed=-(2**63), stop=["a", "b"],
        stop_token_ids=[0, 3], ignore_eos=True, include_stop_str_in_output=True, request_id="Req-1.a:b_c",
        sla_class="batch", stream=True, stream_options={"include_usage": True}, user="ignored", metadata={},
    )  # fmt: skip
    p = req.params
    assert (p.max_tokens, p.temperature, p.top_p, p.top_k, p.seed) == (9, 0.7, 0.9, 5, -(2**63))
    assert (
        p.stop == ("a", "b") and p.stop_token_ids == (0, 3) and p.ignore_eos and p.include_stop_str_in_output
    )
    assert p.sla_class == req.sla_class == "batch" and req.request_id == "Req-1.a:b_c"
    assert req.stream and req.include_usage and req.model == "m"


def test_values_the_float32_sampler_cannot_represent_pass_through():
    # The sampler keeps the top token whatever top_p rounds to (tests/dspark/test_sampling.py).
    assert completion(top_p=5e-324).params.top_p == 5e-324 and completion(top_p=1e-6).params.top_p == 1e-6
    assert completion(temperature=1e-300).params.greedy  # SamplingParams' own rule, not the edge's
    assert completion(temperature=0.5, top_p=0.5).params.top_p == 0.5


@pytest.mark.parametrize(
    "messages, field, words",
    [
        ([], "messages", "at least 1 item"),
        ("hi", "messages", "must be an array"),
        (["hi"], "messages[0]", "must be an object (got 'hi')"),
        ([{"role": "wizard", "content": "x"}], "messages[0].role", "'system', 'user'"),
        ([{"content": "x"}], "messages[0].role", "is required"),
        ([{"role": "user"}], "messages[0].content", "is required"),
        ([{"role": "user", "content": 5}], "messages[0].content", "a string or an array of text parts"),
        ([{"role": "user", "content": None}], "messages[0].content", "a string or an array of text parts"),
        ([{"role": "user", "content": [{"type": "image_url"}]}], "messages[0].content[0].type", "'text'"),
        ([{"role": "user", "content": [{"type": "text"}]}], "messages[0].content[0].text", "required"),
        ([{"role": "user", "content": ["hi"]}], "messages[0].content[0]", "must be an object"),
        ([{"role": "user", "content": ""}], "messages", "all message contents are empty"),
        ([{"role": "user", "content": [{"type": "text", "text": ""}]}], "messages", "are empty"),
        ([user("ok"), user("\ud83d")], "messages[1].content", "surrogate"),
        ([user([{"type": "text", "text": "\udcff"}])], "messages[0].content[0].text", "surrogate"),
        ([{"role": "user", "content": "x"}] * 1025, "messages", "at most 1024 items"),
    ],
)  # fmt: skip
def test_chat_refusals_name_the_field(messages, field, words):
    err = refusal(chat, messages)
    assert err.field == field and words in err.message, err


def test_chat_takes_text_parts_and_max_completion_tokens():
    parts = [
        {"type": "text", "text": "hi "},
        {"type": "text", "text": ""},
        {"type": "text", "text": "\x00\u202e"},
    ]
    req = chat([{"role": "user", "content": parts, "name": "ignored"}], max_completion_tokens=7, max_tokens=3)
    assert req.params.max_tokens == 7 and req.messages == [{"role": "user", "content": "hi \x00\u202e"}]
    assert chat([{"role": "user", "content": "hi"}], max_tokens=3).params.max_tokens == 3
    assert req.prompt_field == "messages" and req.prompt is None
    assert refusal(chat, [{"role": "user", "content": "hi"}], max_completion_tokens=0).field == (
        "max_completion_tokens"
    )


def grpc(**kwargs):
    return grpc_request(build_request(**kwargs), LIMITS)


@pytest.mark.parametrize(
    "kwargs, field, words",
    [
        ({"prompt": ""}, "prompt", "must not be empty"),
        ({"prompt": "x", "prompt_token_ids": [1]}, "prompt", "not both"),
        ({"prompt": "x" * 5000}, "prompt", "exceeds the limit of 4096 bytes"),
        ({"prompt_token_ids": [1] * 1025}, "prompt_token_ids", "exceed the limit"),
        ({"prompt_token_ids": [1, -5]}, "prompt_token_ids[1]", "greater than or equal to 0"),
        ({"prompt": "x", "max_tokens": 0}, "max_tokens", "greater than or equal to 1"),
        ({"prompt": "x", "max_tokens": -(2**31)}, "max_tokens", "greater than or equal to 1"),
        ({"prompt": "x", "temperature": -1.0}, "temperature", "greater than or equal to 0"),
        ({"prompt": "x", "temperature": float("nan")}, "temperature", "must be a finite number"),
        ({"prompt": "x", "temperature": float("inf")}, "temperature", "must be a finite number"),
        ({"prompt": "x", "temperature": 1e308}, "temperature", "less than or equal to 2"),
        ({"prompt": "x", "top_p": 0.0}, "top_p", "greater than 0"),
        ({"prompt": "x", "top_p": 1.01}, "top_p", "less than or equal to 1"),
        ({"prompt": "x", "top_p": float("-inf")}, "top_p", "must be a finite number"),
        ({"prompt": "x", "top_k": -7}, "top_k", "greater than or equal to -1"),
        ({"prompt": "x", "stop_token_ids": [-1]}, "stop_token_ids[0]", "greater than or equal to 0"),
        ({"prompt": "x", "stop_token_ids": list(range(65))}, "stop_token_ids", "at most 64 items"),
        ({"prompt": "x", "stop": ["s"] * 17}, "stop", "at most 16 items"),
        ({"prompt": "x", "stop": ["ok", ""]}, "stop[1]", "at least 1 character"),
        ({"prompt": "x", "stop": ["y" * 257]}, "stop[0]", "at most 256 characters"),
        ({"prompt": "x", "request_id": "r" * 129}, "request_id", "at most 128 characters"),
        ({"prompt": "x", "request_id": "r/1"}, "request_id", "only letters, digits"),
        ({"prompt": "x", "sla_class": "s" * 65}, "sla_class", "at most 64 characters"),
        ({"prompt": "x", "model": "m" * 257}, "model", "at most 256 characters"),
    ],
)
def test_grpc_refusals_name_the_field(kwargs, field, words):
    err = refusal(grpc, **kwargs)
    assert err.field == field and words in err.message, err


def test_grpc_unset_options_take_defaults():
    req = grpc(prompt="hi", request_id="r1")
    assert req.params.temperature == 1.0 and req.params.max_tokens == 16 and req.request_id == "r1"
    assert req.stream and req.model is None and req.sla_class is None
    assert grpc(prompt="hi", temperature=0.0).params.greedy
    bare = grpc_request(pb.GenerateRequest(prompt="hi"), LIMITS)  # empty strings mean unset in proto3
    assert bare.request_id is None and bare.model is None and bare.params == grpc(prompt="hi").params


def test_grpc_and_http_share_the_rules():
    options = dict(max_tokens=9, temperature=0.7, top_p=0.9, top_k=5, seed=INT64_MAX, stop=["a"])
    options |= dict(stop_token_ids=[3], ignore_eos=True, include_stop_str_in_output=True, sla_class="batch")
    over_grpc = grpc(prompt="x", request_id="r1", **options)
    over_http = completion(prompt="x", request_id="r1", **options)
    assert over_grpc.params == over_http.params and over_grpc.request_id == over_http.request_id
    assert grpc(prompt_token_ids=[4, 5]).prompt_token_ids == [4, 5]
    assert grpc(prompt_token_ids=[4, 5]).prompt_field == "prompt_token_ids"
