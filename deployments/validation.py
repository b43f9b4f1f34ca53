"""Input validation at the edge: raw HTTP bodies and gRPC messages become one `GenerationRequest`.

Pure functions (no I/O), in two steps. First the HTTP body is parsed with guards
json.loads lacks: it recurses once per nesting level (a body of 100k `[` is a RecursionError), decodes
UTF-16 and lone surrogates from bytes, takes `NaN` and `Infinity`, and turns a 5000-digit literal into
a ValueError. Then the object (or the gRPC message, flattened to one) is validated by its schema
(deployments/schemas.py), so both surfaces share the rules. Every refusal is an InvalidRequestError
naming the field, which reaches the client as HTTP 400 / INVALID_ARGUMENT (deployments/errors.py).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from itertools import accumulate
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from deployments.errors import invalid_request
from deployments.schemas import ChatCompletionRequest, CompletionRequest, GenerateRequest, SamplingFields
from dspark.errors import InvalidRequestError
from dspark.sampling_params import SamplingParams

MAX_JSON_DEPTH = 32  # a chat body with text parts needs 5 levels; far deeper is no request
MAX_INT_DIGITS = 64  # int64 has 19; a longer literal is no valid value of any field
# A JSON string, complete or running to the end of the text: it always matches from its opening quote,
# so scanning never backtracks over a long unterminated string (a quadratic trap for the plain pattern).
_JSON_STRING = re.compile(r'"(?:[^"\\]+|\\.?)*"?', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_BRACKET_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}
_SAMPLING_OPTIONS = ("temperature", "top_p", "top_k", "max_tokens", "seed")
Schema = TypeVar("Schema", bound=BaseModel)


@dataclass(frozen=True)
class Limits:
    max_request_bytes: int = 1 << 20  # whole HTTP body, or a gRPC prompt's UTF-8 size


@dataclass(frozen=True)
class GenerationRequest:
    params: SamplingParams
    model: str | None = None  # None: the served model
    prompt: str | None = None
    prompt_token_ids: list[int] | None = None
    messages: list[dict] | None = None  # chat: rendered by the tokenizer's chat template
    stream: bool = False
    include_usage: bool = False
    request_id: str | None = None
    sla_class: str | None = None
    prompt_field: str = "prompt"  # how errors about the prompt name it on this surface


def parse_json_body(raw: bytes, limits: Limits) -> dict:
    if len(raw) > limits.max_request_bytes:
        raise InvalidRequestError(
            "body", f"{len(raw)} bytes exceed the limit of {limits.max_request_bytes} bytes"
        )
    try:
        text = raw.decode("utf-8")  # strict: also refuses surrogates encoded as UTF-8 bytes
    except UnicodeDecodeError as exc:
        raise InvalidRequestError(
            "body", f"is not valid UTF-8 (byte 0x{raw[exc.start]:02x} at offset {exc.start})"
        ) from None
    if nesting_depth(text) > MAX_JSON_DEPTH:
        raise InvalidRequestError("body", f"nesting deeper than {MAX_JSON_DEPTH} levels")
    try:
        body = json.loads(text, parse_constant=_refuse_constant, parse_int=_parse_int)
    except json.JSONDecodeError as exc:
        raise InvalidRequestError("body", f"is not valid JSON ({exc})") from None
    if not isinstance(body, dict):
        raise InvalidRequestError("body", f"must be a JSON object, got {_json_type(body)}")
    return body


def nesting_depth(text: str) -> int:
    """The deepest bracket nesting outside strings (linear time): a bound on json.loads' recursion."""
    brackets = _NOT_BRACKET.sub("", _JSON_STRING.sub("", text))
    return max(accumulate((_BRACKET_STEP[c] for c in brackets), initial=0))


def completion_request(body: dict, limits: Limits) -> GenerationRequest:
    """POST /v1/completions."""
    req = _validate(CompletionRequest, body)
    text, ids = (req.prompt, None) if isinstance(req.prompt, str) else (None, list(req.prompt))
    return _generation(
        req,
        req.max_tokens,
        stream=bool(req.stream),
        include_usage=_include_usage(req),
        prompt=text,
        prompt_token_ids=ids,
    )


def chat_request(body: dict, limits: Limits) -> GenerationRequest:
    """POST /v1/chat/completions."""
    req = _validate(ChatCompletionRequest, body)
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    return _generation(
        req,
        max_tokens,
        stream=bool(req.stream),
        include_usage=_include_usage(req),
        messages=[{"role": m.role, "content": m.text()} for m in req.messages],
        prompt_field="messages",
    )


def grpc_request(message, limits: Limits) -> GenerationRequest:
    """A dspark.v1.GenerateRequest, validated by the same rules as the HTTP bodies."""
    if message.prompt and message.prompt_token_ids:
        raise InvalidRequestError("prompt", "set prompt or prompt_token_ids, not both")
    if not message.prompt and not message.prompt_token_ids:
        raise InvalidRequestError("prompt", "must not be empty")
    if len(message.prompt.encode()) > limits.max_request_bytes:
        raise InvalidRequestError("prompt", f"exceeds the limit of {limits.max_request_bytes} bytes")
    if len(message.prompt_token_ids) * 4 > limits.max_request_bytes:
        raise InvalidRequestError("prompt_token_ids", f"exceed the limit of {limits.max_request_bytes} bytes")
    req = _validate(GenerateRequest, grpc_fields(message))
    return _generation(
        req,
        req.max_tokens,
        stream=True,
        include_usage=False,
        prompt=req.prompt,
        prompt_token_ids=req.prompt_token_ids,
        prompt_field="prompt" if req.prompt else "prompt_token_ids",
    )


def grpc_fields(message) -> dict:
    """The message as the schema's flat dict: sampling options at the top, unset and empty fields left out."""
    s = message.sampling
    fields = {name: getattr(s, name) for name in _SAMPLING_OPTIONS if s.HasField(name)}
    fields |= {
        "stop": list(s.stop),
        "stop_token_ids": list(s.stop_token_ids),
        "ignore_eos": s.ignore_eos,
        "include_stop_str_in_output": s.include_stop_str_in_output,
    }
    # Empty strings mean "unset" in proto3: the server's default, as the .proto says.
    fields |= {
        name: v for name in ("request_id", "model", "sla_class", "prompt") if (v := getattr(message, name))
    }
    if message.prompt_token_ids:
        fields["prompt_token_ids"] = list(message.prompt_token_ids)
    return fields


def _validate(schema: type[Schema], data: dict) -> Schema:
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        raise invalid_request(exc) from None


def _include_usage(req: CompletionRequest | ChatCompletionRequest) -> bool:
    return bool(req.stream_options and req.stream_options.include_usage)


def _generation(req: SamplingFields, max_tokens: int | None, **fields) -> GenerationRequest:
    options = {
        name: v for name in ("temperature", "top_p", "top_k", "seed") if (v := getattr(req, name)) is not None
    }
    if max_tokens is not None:
        options["max_tokens"] = max_tokens
    params = SamplingParams(
        **options,
        stop=req.stop_strings(),
        stop_token_ids=tuple(req.stop_token_ids or ()),
        ignore_eos=bool(req.ignore_eos),
        include_stop_str_in_output=bool(req.include_stop_str_in_output),
        sla_class=req.sla_class,
    )
    return GenerationRequest(
        params=params, model=req.model, request_id=req.request_id, sla_class=req.sla_class, **fields
    )


def _refuse_constant(name: str):
    raise InvalidRequestError("body", f"{name} is not valid JSON: numbers must be finite")


def _parse_int(literal: str) -> int:
    if len(literal) > MAX_INT_DIGITS:
        raise InvalidRequestError("body", f"an integer literal of {len(literal)} digits is out of range")
    return int(literal)


def _json_type(value) -> str:
    return {list: "array", str: "string", int: "integer", float: "number", bool: "boolean"}.get(
        type(value), "null"
    )
