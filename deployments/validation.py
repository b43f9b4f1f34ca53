"""Input validation at the edge: HTTP bodies and gRPC messages become one `GenerationRequest`.

Pure functions with no Ray and no I/O. Every refusal is an InvalidRequestError naming the field, so
it reaches the client as HTTP 400 / INVALID_ARGUMENT with that name (see deployments/errors.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from dspark.errors import InvalidRequestError
from dspark.sampling_params import SamplingParams

# Roles a chat template is expected to know; anything else is refused up front.
CHAT_ROLES = ("system", "user", "assistant", "tool", "developer")
# OpenAI options this server does not implement: accepted only at their neutral value.
NEUTRAL = {
    "n": (None, 1),
    "best_of": (None, 1),
    "echo": (None, False),
    "logprobs": (None, False, 0),
    "top_logprobs": (None, 0),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "suffix": (None, ""),
    "logit_bias": (None, {}),
    "tools": (None, []),
}


@dataclass(frozen=True)
class Limits:
    max_request_bytes: int = 1 << 20  # whole HTTP body, or a gRPC prompt's UTF-8 size
    max_stop_strings: int = 16


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
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidRequestError("body", f"is not valid JSON ({exc})") from None
    if not isinstance(body, dict):
        raise InvalidRequestError("body", f"must be a JSON object, got {_json_type(body)}")
    return body


def completion_request(body: dict, limits: Limits) -> GenerationRequest:
    """POST /v1/completions."""
    if "prompt" not in body or body["prompt"] is None:
        raise InvalidRequestError("prompt", "is required")
    prompt, ids = _prompt(body["prompt"])
    return _request(body, limits, prompt=prompt, prompt_token_ids=ids)


def chat_request(body: dict, limits: Limits) -> GenerationRequest:
    """POST /v1/chat/completions."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequestError("messages", "must be a non-empty array of {role, content} objects")
    clean = []
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise InvalidRequestError(where, f"must be an object, got {_json_type(msg)}")
        role, content = msg.get("role"), msg.get("content")
        if role not in CHAT_ROLES:
            raise InvalidRequestError(f"{where}.role", f"must be one of {list(CHAT_ROLES)}, got {role!r}")
        clean.append({"role": role, "content": _chat_content(content, f"{where}.content")})
    if not any(m["content"] for m in clean):
        raise InvalidRequestError("messages", "all message contents are empty")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    return _request({**body, "max_tokens": max_tokens}, limits, messages=clean, prompt_field="messages")


def grpc_request(req, limits: Limits) -> GenerationRequest:
    """A dspark.v1.GenerateRequest; proto typing already fixes the field types."""
    if req.prompt and req.prompt_token_ids:
        raise InvalidRequestError("prompt", "set prompt or prompt_token_ids, not both")
    if not req.prompt and not req.prompt_token_ids:
        raise InvalidRequestError("prompt", "must not be empty")
    if len(req.prompt.encode()) > limits.max_request_bytes:
        raise InvalidRequestError("prompt", f"exceeds the limit of {limits.max_request_bytes} bytes")
    if len(req.prompt_token_ids) * 4 > limits.max_request_bytes:
        raise InvalidRequestError("prompt_token_ids", f"exceed the limit of {limits.max_request_bytes} bytes")
    s = req.sampling
    options = {
        name: getattr(s, name)
        for name in ("temperature", "top_p", "top_k", "max_tokens", "seed")
        if s.HasField(name)
    }
    if len(s.stop) > limits.max_stop_strings:
        raise InvalidRequestError("stop", f"at most {limits.max_stop_strings} stop strings")
    params = SamplingParams(
        **options,
        stop=tuple(s.stop),
        stop_token_ids=tuple(s.stop_token_ids),
        ignore_eos=s.ignore_eos,
        include_stop_str_in_output=s.include_stop_str_in_output,
        sla_class=req.sla_class or None,
    )
    return GenerationRequest(
        params=params,
        model=req.model or None,
        prompt=req.prompt or None,
        prompt_token_ids=list(req.prompt_token_ids) or None,
        stream=True,
        request_id=req.request_id or None,
        sla_class=req.sla_class or None,
        prompt_field="prompt" if req.prompt else "prompt_token_ids",
    )


def _request(body: dict, limits: Limits, **prompt) -> GenerationRequest:
    for name, allowed in NEUTRAL.items():
        if name in body and body[name] not in allowed:
            raise InvalidRequestError(name, f"is not supported by this server (got {body[name]!r})")
    model = _optional(body, "model", str, "a string")
    stream = _optional(body, "stream", bool, "a boolean") or False
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise InvalidRequestError("stream_options", f"must be an object, got {_json_type(options)}")
    include_usage = bool((options or {}).get("include_usage", False))
    stop = body.get("stop")
    if stop is None:
        stop = ()
    elif isinstance(stop, str):
        stop = (stop,)
    elif not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise InvalidRequestError("stop", "must be a string or an array of strings")
    if len(stop) > limits.max_stop_strings:
        raise InvalidRequestError("stop", f"at most {limits.max_stop_strings} stop strings")
    stop_ids = body.get("stop_token_ids") or []
    if not isinstance(stop_ids, list):
        raise InvalidRequestError("stop_token_ids", "must be an array of integers")
    sampling = {
        name: body[name]
        for name in ("temperature", "top_p", "top_k", "max_tokens", "seed", "ignore_eos")
        if body.get(name) is not None
    }
    sla_class = _optional(body, "sla_class", str, "a string")
    params = SamplingParams(
        **sampling,
        stop=tuple(stop),
        stop_token_ids=tuple(stop_ids),
        include_stop_str_in_output=bool(body.get("include_stop_str_in_output", False)),
        sla_class=sla_class,
    )
    return GenerationRequest(
        params=params,
        model=model,
        stream=stream,
        include_usage=include_usage,
        request_id=_optional(body, "request_id", str, "a string"),
        sla_class=sla_class,
        **prompt,
    )


def _prompt(value) -> tuple[str | None, list[int] | None]:
    # OpenAI accepts a string, an array of token ids, or arrays of either (a batch of one is fine).
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str | list):
        value = value[0]
    if isinstance(value, str):
        if not value:
            raise InvalidRequestError("prompt", "must not be empty")
        return value, None
    if isinstance(value, list):
        if not value:
            raise InvalidRequestError("prompt", "must not be empty")
        if all(isinstance(t, int) and not isinstance(t, bool) for t in value):
            return None, list(value)
        if all(isinstance(p, str | list) for p in value):
            raise InvalidRequestError("prompt", "only one prompt per request is supported")
    raise InvalidRequestError("prompt", f"must be a string or an array of token ids, got {_json_type(value)}")


def _chat_content(content, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
        parts = []
        for j, part in enumerate(content):
            if (
                not isinstance(part, dict)
                or part.get("type") != "text"
                or not isinstance(part.get("text"), str)
            ):
                raise InvalidRequestError(
                    f"{where}[{j}]", "only {type: text, text: string} parts are supported"
                )
            parts.append(part["text"])
        return "".join(parts)
    raise InvalidRequestError(where, f"must be a string or an array of text parts, got {_json_type(content)}")


def _optional(body: dict, name: str, kind: type, description: str):
    value = body.get(name)
    if value is not None and not isinstance(value, kind):
        raise InvalidRequestError(name, f"must be {description}, got {_json_type(value)}")
    return value


def _json_type(value) -> str:
    if value is None:
        return "null"
    return {
        bool: "boolean",
        int: "integer",
        float: "number",
        str: "string",
        list: "array",
        dict: "object",
    }.get(type(value), type(value).__name__)
