"""The request schemas of the serving edge, as pydantic models: the two OpenAI bodies and the gRPC
GenerateRequest share one set of sampling rules (`SamplingFields`).

Pure declarations: no Ray, no I/O. The rules are there so that nothing a client sends can reach
the tokenizer or the engine in a shape that fails there:
- types are strict ("10" is not an integer, 1 is not a boolean, 2.0 is not a token id);
- floats are finite and every number has a range (a seed fits int64, a token id int32);
- every string is free of lone surrogates (JSON's "\\udcff" decodes to one, and no tokenizer or
  UTF-8 encoder takes it) and has a length cap, every list a count cap;
- identifiers (request_id, sla_class) use a charset safe in logs, metric labels and gRPC metadata.
Prompt and message text have no length cap of their own: the body limit (HTTP) or the prompt byte
limit (gRPC) bounds them, and the frontend checks the tokenized length against the model's context.

Errors name pydantic's location of the culprit; deployments/errors.py turns them into our
InvalidRequestError ("messages[0].content: ..."). Tagged unions put their tag in that location:
tags here are written <like this>, and the error mapper leaves them out of the field path.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    StringConstraints,
    Tag,
    field_validator,
)
from pydantic_core import PydanticCustomError

INT32_MAX = 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_NEW_TOKENS = 1 << 20  # far above any context; the frontend checks the model's own
MAX_MODEL_CHARS = 256
MAX_ID_CHARS = 128
MAX_SLA_CLASS_CHARS = 64
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256
MAX_STOP_TOKEN_IDS = 64
MAX_MESSAGES = 1024
MAX_CONTENT_PARTS = 1024
_SAFE_ID = re.compile(r"[A-Za-z0-9._:\-]+")
CHAT_ROLES = ("system", "user", "assistant", "tool", "developer")


def _no_lone_surrogates(text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise PydanticCustomError(
            "lone_surrogate",
            "contains a lone surrogate ({code}) at index {index}; strings must be valid Unicode",
            {"code": f"U+{ord(text[exc.start]):04X}", "index": exc.start},
        ) from None
    return text


def _safe_id(text: str) -> str:
    if not _SAFE_ID.fullmatch(text):
        raise PydanticCustomError("identifier", "may hold only letters, digits, '.', '_', ':' and '-'")
    return text


def string(min_length: int = 0, max_length: int | None = None) -> Any:
    """A string that is valid Unicode (so UTF-8 encodes it), within the given length in characters.

    pydantic-core already refuses a lone surrogate in a string with length constraints (error type
    string_unicode) but not in a bare `str`; the explicit check keeps the rule off that detail.
    """
    limits = StringConstraints(min_length=min_length, max_length=max_length)
    return Annotated[str, limits, AfterValidator(_no_lone_surrogates)]


def identifier(max_length: int) -> Any:
    limits = StringConstraints(min_length=1, max_length=max_length)
    return Annotated[str, limits, AfterValidator(_safe_id)]


TokenId = Annotated[int, Field(ge=0, le=INT32_MAX)]
StopString = string(1, MAX_STOP_CHARS)


def _one_of(message: str, **tags: type) -> Discriminator:
    """Choose a union member by the JSON type of the input; no member fits: `message`."""

    def pick(value: Any) -> str | None:
        return next((tag for tag, kind in tags.items() if isinstance(value, kind)), None)

    return Discriminator(pick, custom_error_type="wrong_type", custom_error_message=message)


Stop = Annotated[
    Annotated[StopString, Tag("<one>")]
    | Annotated[list[StopString], Field(max_length=MAX_STOP_STRINGS), Tag("<list>")],
    _one_of("must be a string or an array of strings", **{"<one>": str, "<list>": list}),
]


def _one_prompt(value: Any) -> Any:
    # OpenAI takes a batch of prompts; a batch of one is the prompt itself.
    if isinstance(value, list) and value and all(isinstance(p, str | list) for p in value):
        if len(value) > 1:
            raise PydanticCustomError("batch", "only one prompt per request is supported")
        return value[0]
    return value


Prompt = Annotated[
    Annotated[string(1), Tag("<text>")] | Annotated[list[TokenId], Field(min_length=1), Tag("<token ids>")],
    _one_of("must be a string or an array of token ids", **{"<text>": str, "<token ids>": list}),
    BeforeValidator(_one_prompt),
]


def neutral(*allowed: Any) -> Any:
    """An OpenAI option this server does not implement: accepted only at its neutral value (or null)."""

    def check(value: Any) -> Any:
        if value is not None and not any(type(value) is type(a) and value == a for a in allowed):
            raise PydanticCustomError(
                "unsupported",
                "is not supported by this server: only {allowed} is accepted",
                {"allowed": " or ".join(repr(a) for a in allowed)},
            )
        return value

    return Annotated[Any, AfterValidator(check)]


class Strict(BaseModel):
    """Strict types, finite floats; unknown fields are ignored, as OpenAI clients send many."""

    model_config = ConfigDict(strict=True, allow_inf_nan=False, extra="ignore", frozen=True)


class SamplingFields(Strict):
    """The decoding options and identifiers every surface takes, under the same names and rules."""

    model: string(max_length=MAX_MODEL_CHARS) | None = None
    max_tokens: Annotated[int, Field(ge=1, le=MAX_NEW_TOKENS)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    top_k: Annotated[int, Field(ge=-1, le=INT32_MAX)] | None = None
    seed: Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)] | None = None
    stop: Stop | None = None
    stop_token_ids: Annotated[list[TokenId], Field(max_length=MAX_STOP_TOKEN_IDS)] | None = None
    ignore_eos: bool | None = None
    include_stop_str_in_output: bool | None = None
    request_id: identifier(MAX_ID_CHARS) | None = None
    sla_class: identifier(MAX_SLA_CLASS_CHARS) | None = None

    def stop_strings(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())


class StreamOptions(Strict):
    include_usage: bool | None = None


class OpenAIFields(SamplingFields):
    """What both OpenAI routes add: streaming, and the options accepted only at neutral values."""

    stream: bool | None = None
    stream_options: StreamOptions | None = None
    n: neutral(1) = None
    best_of: neutral(1) = None
    echo: neutral(False) = None
    logprobs: neutral(False, 0) = None
    top_logprobs: neutral(0) = None
    presence_penalty: neutral(0, 0.0) = None
    frequency_penalty: neutral(0, 0.0) = None
    suffix: neutral("") = None
    logit_bias: neutral({}) = None
    tools: neutral([]) = None


class CompletionRequest(OpenAIFields):
    """POST /v1/completions."""

    prompt: Prompt


class TextPart(Strict):
    type: Literal["text"]
    text: string()


Content = Annotated[
    Annotated[string(), Tag("<text>")]
    | Annotated[list[TextPart], Field(max_length=MAX_CONTENT_PARTS), Tag("<parts>")],
    _one_of("must be a string or an array of text parts", **{"<text>": str, "<parts>": list}),
]


class ChatMessage(Strict):
    role: Literal[CHAT_ROLES]
    content: Content

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(OpenAIFields):
    """POST /v1/chat/completions."""

    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=MAX_MESSAGES)]
    max_completion_tokens: Annotated[int, Field(ge=1, le=MAX_NEW_TOKENS)] | None = None

    @field_validator("messages")
    @classmethod
    def _some_text(cls, messages: list[ChatMessage]) -> list[ChatMessage]:
        if not any(m.text() for m in messages):
            raise PydanticCustomError("empty", "all message contents are empty")
        return messages


class GenerateRequest(SamplingFields):
    """dspark.v1.GenerateRequest, flattened (sampling options at the top) by deployments/validation.py."""

    prompt: string(1) | None = None
    prompt_token_ids: Annotated[list[TokenId], Field(min_length=1)] | None = None
