"""The one error map: engine and Ray errors to HTTP statuses, gRPC codes and OpenAI bodies."""

from __future__ import annotations

import asyncio
import pickle

import grpc
import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from ray.exceptions import RayTaskError
from ray.serve.exceptions import BackPressureError

from deployments.errors import classify, describe, field_path, invalid_request
from dspark.errors import AdmissionError, EngineDeadError, InvalidRequestError, RequestFailedError


@pytest.mark.parametrize(
    "exc, status, code",
    [
        (InvalidRequestError("top_p", "must be in (0, 1]"), 400, grpc.StatusCode.INVALID_ARGUMENT),
        (AdmissionError("engine full", retry_after_s=2.5), 429, grpc.StatusCode.RESOURCE_EXHAUSTED),
        (
            BackPressureError(num_queued_requests=9, max_queued_requests=8),
            429,
            grpc.StatusCode.RESOURCE_EXHAUSTED,
        ),
        (EngineDeadError("shut down"), 503, grpc.StatusCode.UNAVAILABLE),
        (asyncio.CancelledError(), 499, grpc.StatusCode.CANCELLED),
        (KeyError("surprise"), 500, grpc.StatusCode.INTERNAL),
        (RequestFailedError("request r failed and was stopped: ..."), 500, grpc.StatusCode.INTERNAL),
    ],
)
def test_classify(exc, status, code):
    info = classify(exc)
    assert (info.http_status, info.grpc_code) == (status, code)


def test_invalid_request_names_the_field_everywhere():
    info = classify(InvalidRequestError("max_tokens", "must be >= 1, got 0"))
    assert info.message == "max_tokens: must be >= 1, got 0"
    assert info.openai_body()["error"]["param"] == "max_tokens"
    assert ("dspark-field", "max_tokens") in info.grpc_trailers()


def test_admission_carries_a_retry_hint():
    info = classify(AdmissionError("KV cache exhausted", retry_after_s=2.5))
    assert info.http_headers() == {"Retry-After": "3"}
    assert ("retry-after-ms", "2500") in info.grpc_trailers()
    assert "retry in 2.5s" in info.message


def test_errors_from_a_replica_are_unwrapped():
    cause = pickle.loads(pickle.dumps(InvalidRequestError("prompt", "must not be empty")))
    wrapped = RayTaskError("generate", "traceback", cause)
    info = classify(wrapped)
    assert info.http_status == 400 and info.field == "prompt"


def test_a_failed_request_is_told_why():
    message = "request r failed and was stopped: the target's logits for this request are not finite"
    info = classify(RequestFailedError(message))
    assert info.message == message and info.openai_body()["error"]["code"] == "internal"


def test_internal_errors_do_not_leak_details():
    assert "secret" not in classify(RuntimeError("secret path /etc")).message


@pytest.mark.parametrize(
    "loc, path",
    [
        (("messages", 0, "content"), "messages[0].content"),
        (("messages", 2, "content", "<parts>", 1, "text"), "messages[2].content[1].text"),
        (("prompt", "<token ids>", 3), "prompt[3]"),
        (("stream_options", "include_usage"), "stream_options.include_usage"),
        ((), ""),
    ],
)
def test_field_path_is_what_the_client_wrote(loc, path):
    assert field_path(loc) == path


@pytest.mark.parametrize(
    "value, text",
    [
        ("short", "'short'"),
        ("\udcff\u202e", "'\\udcff\\u202e'"),
        ("x" * 41, "a string of 41 characters"),
        (10**40, "an integer of 133 bits"),
        (-5, "-5"),
        (float("nan"), "nan"),
        ([1, 2], "an array of 2 items"),
        ({"a": 1}, "an object"),
        (None, "None"),
    ],
)
def test_describe_is_short_and_ascii(value, text):
    assert describe(value) == text


def test_a_validation_error_becomes_a_400_naming_the_field():
    class Body(BaseModel):
        model_config = ConfigDict(strict=True)
        max_tokens: int = Field(ge=1)
        top_p: float = 1.0

    with pytest.raises(ValidationError) as err:
        Body.model_validate({"max_tokens": 0, "top_p": "x"})
    invalid = invalid_request(err.value)
    assert invalid.field == "max_tokens"
    assert invalid.message == "must be greater than or equal to 1 (got 0); and 1 more error"
    info = classify(invalid)
    assert (info.http_status, info.grpc_code) == (400, grpc.StatusCode.INVALID_ARGUMENT)
    assert info.openai_body()["error"]["param"] == "max_tokens"
