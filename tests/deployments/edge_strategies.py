"""Hypothesis strategies for fuzzing the serving edge: HTTP bodies as raw bytes and gRPC GenerateRequests.

Pure (no I/O). Bodies start valid and cheap (max_tokens <= 8) and are then mutated: a field's value
replaced by a wild one (wrong types, extreme numbers, lone surrogates, huge strings, deep nesting),
unknown fields added, or the encoded bytes cut, spliced or made invalid UTF-8. Some stay valid, so
the fuzz also drives real generations between the refusals.
"""

from __future__ import annotations

import json

from hypothesis import strategies as st

from dspark_client.proto import pb

INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)
EXTREME_NUMBERS = [
    0, -0.0, 1, -1, 0.5, 2, 1e308, -1e308, 5e-324, 1e-300, float("inf"), float("-inf"), float("nan"),
    2**31, 2**63 - 1, 2**63, -(2**63) - 1, 2**64, 10**30, -(10**30), 1e400,
]  # fmt: skip
HUGE_STRINGS = ["x" * 300, "r" * 129, "a" * 60_000, "\u202e" * 2_000, "\x00" * 500, "[" * 5_000]
# Lone surrogates, control and direction characters, empty: what tokenizers and encoders trip on.
NASTY_STRINGS = [
    "\udcff\x00\u202e",
    "\ud800",
    "a\udfffb",
    "\ud83d",
    "",
    "\x00",
    "\u202e\u200f",
    "\U0001f642" * 50,
]
COMPLETION_FIELDS = [
    "prompt", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stop_token_ids", "ignore_eos",
    "include_stop_str_in_output", "request_id", "sla_class", "model", "stream", "stream_options", "n",
    "logprobs", "echo", "best_of", "presence_penalty", "frequency_penalty", "suffix", "logit_bias", "tools",
]  # fmt: skip
CHAT_FIELDS = ["messages", "max_completion_tokens"] + COMPLETION_FIELDS[1:]
ROLES = ["system", "user", "assistant", "tool", "developer"]
MESSAGE_KEYS = ["role", "content", "text part", "name"]

# Any character at all, lone surrogates included (hypothesis leaves category Cs out by default).
any_char = st.characters(exclude_categories=())
any_text = st.text(any_char, max_size=40)
# What a proto3 string can hold: valid Unicode only.
unicode_text = st.text(st.characters(exclude_categories=("Cs",)), max_size=40)


def _nested(value, depth: int):
    for _ in range(depth):
        value = [value]
    return value


json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(10**40), max_value=10**40),
    st.floats(),
    st.sampled_from(EXTREME_NUMBERS),
    any_text,
    st.sampled_from(HUGE_STRINGS),
)
json_value = st.recursive(
    json_leaf,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(any_text, inner, max_size=4),
    max_leaves=12,
)
wild_value = st.one_of(
    st.sampled_from(EXTREME_NUMBERS),
    st.sampled_from(NASTY_STRINGS + HUGE_STRINGS),
    st.builds(_nested, st.sampled_from([1, "x", {}]), st.sampled_from([2, 31, 33, 200])),  # the cap is 32
    st.lists(st.sampled_from(NASTY_STRINGS + EXTREME_NUMBERS), min_size=1, max_size=20),
    json_value,
)

small_prompt = st.one_of(
    st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=60),
    st.lists(st.integers(0, 383), min_size=1, max_size=20),  # the test tokenizer's vocabulary
)
content_part = st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=30)})
message = st.fixed_dictionaries(
    {
        "role": st.sampled_from(ROLES),
        "content": st.one_of(
            st.text(min_size=1, max_size=60), st.lists(content_part, min_size=1, max_size=3)
        ),
    }
)
sampling = st.fixed_dictionaries(
    {"max_tokens": st.integers(1, 8)},
    optional={
        # In range, but tiny values once overflowed the float32 sampler.
        "temperature": st.sampled_from([0, 0.0, -0.0, 0.7, 1, 2, 1e-8, 1e-300, 5e-324]),
        "top_p": st.sampled_from([0.1, 0.9, 1, 1e-300, 5e-324]),
        "top_k": st.sampled_from([-1, 0, 1, 50]),
        "seed": st.integers(*INT64),
        "stop": st.one_of(
            st.text(min_size=1, max_size=5), st.lists(st.text(min_size=1, max_size=5), max_size=3)
        ),
        "stop_token_ids": st.lists(st.integers(0, 383), max_size=3),
        "ignore_eos": st.booleans(),
        "stream": st.booleans(),
        "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
        "sla_class": st.sampled_from(["interactive", "batch"]),
    },
)
valid_completion = st.builds(lambda p, s: {"prompt": p, **s}, small_prompt, sampling)
valid_chat = st.builds(lambda m, s: {"messages": m, **s}, st.lists(message, min_size=1, max_size=3), sampling)


@st.composite
def mutated(draw, valid: st.SearchStrategy, fields: list[str]) -> dict:
    body = draw(valid)
    if "messages" in body and draw(st.booleans()):  # inside the first message
        first, where, value = body["messages"][0], draw(st.sampled_from(MESSAGE_KEYS)), draw(wild_value)
        if where == "text part":
            first["content"] = [{"type": "text", "text": value}]
        else:
            first[where] = value
    for _ in range(draw(st.integers(0, 3))):
        # The prompt (or messages) one time in three: it goes furthest, to the tokenizer.
        field = draw(st.one_of(st.just(fields[0]), st.just(fields[0]), st.sampled_from(fields)))
        body[field] = draw(wild_value)
    if draw(st.booleans()):
        body |= draw(st.dictionaries(any_text, json_value, max_size=3))  # unknown fields
    return body


def _encode(body: dict, ascii_only: bool) -> bytes:
    # With ensure_ascii, surrogates travel as \\udcff escapes; without, as (invalid) UTF-8 bytes.
    return json.dumps(body, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")


@st.composite
def raw_mutation(draw, encoded: bytes) -> bytes:
    where = draw(st.integers(0, len(encoded)))
    kind = draw(st.sampled_from(["cut", "splice", "bad utf-8"]))
    if kind == "cut":
        return encoded[:where]
    insert = draw(st.binary(min_size=1, max_size=8)) if kind == "splice" else b"\xed\xb3\xbf\xff"
    return encoded[:where] + insert + encoded[where:]


@st.composite
def http_case(draw) -> tuple[str, bytes]:
    """(path, raw body)."""
    chat = draw(st.booleans())
    path = "/v1/chat/completions" if chat else "/v1/completions"
    valid, fields = (valid_chat, CHAT_FIELDS) if chat else (valid_completion, COMPLETION_FIELDS)
    shape = draw(st.sampled_from(["valid", "mutated", "mutated", "mutated", "raw", "structure"]))
    if shape == "structure":  # not an object, or not JSON at all
        raw = draw(
            st.one_of(
                st.binary(max_size=64),
                st.builds(lambda n: b"[" * n, st.sampled_from([1, 32, 33, 1_000, 100_000])),
                st.builds(lambda v: json.dumps(v).encode(), json_value),
            )
        )
        return path, raw
    body = draw(valid) if shape == "valid" else draw(mutated(valid, fields))
    encoded = _encode(body, ascii_only=draw(st.booleans()))
    return path, draw(raw_mutation(encoded)) if shape == "raw" else encoded


def _wild_sampling(draw) -> pb.SamplingOptions:
    s = pb.SamplingOptions(
        stop=draw(st.lists(unicode_text, max_size=draw(st.sampled_from([2, 20])))),
        stop_token_ids=draw(st.lists(st.integers(*INT32), max_size=draw(st.sampled_from([2, 70])))),
        ignore_eos=draw(st.booleans()),
        include_stop_str_in_output=draw(st.booleans()),
    )
    doubles = st.one_of(st.floats(), st.sampled_from([f for f in EXTREME_NUMBERS if isinstance(f, float)]))
    for name, values in [
        ("temperature", st.one_of(st.sampled_from([0.0, 0.7]), doubles)),
        ("top_p", st.one_of(st.sampled_from([0.5, 1.0]), doubles)),
        ("top_k", st.integers(*INT32)),
        ("max_tokens", st.one_of(st.integers(1, 8), st.integers(*INT32))),
        ("seed", st.integers(*INT64)),
    ]:
        if draw(st.booleans()):
            setattr(s, name, draw(values))
    return s


@st.composite
def wild_grpc_case(draw) -> pb.GenerateRequest:
    use_ids = draw(st.booleans())
    return pb.GenerateRequest(
        request_id=draw(st.one_of(st.just(""), st.uuids().map(lambda u: u.hex), unicode_text)),
        model=draw(st.one_of(st.just(""), unicode_text, st.sampled_from(HUGE_STRINGS))),
        prompt=draw(unicode_text) if not use_ids or draw(st.booleans()) else "",
        prompt_token_ids=draw(st.lists(st.integers(*INT32), max_size=8)) if use_ids else [],
        sampling=_wild_sampling(draw),
        sla_class=draw(st.one_of(st.just(""), st.sampled_from(["batch", "s" * 65]), unicode_text)),
    )


def _valid_grpc(prompt, options: dict) -> pb.GenerateRequest:
    options = {k: v for k, v in options.items() if k not in ("stream", "stream_options", "sla_class")}
    ids = {"prompt_token_ids": prompt} if isinstance(prompt, list) else {"prompt": prompt}
    stop = options.pop("stop", [])
    sampling = pb.SamplingOptions(stop=[stop] if isinstance(stop, str) else stop, **options)
    return pb.GenerateRequest(**ids, sampling=sampling)


valid_grpc_case = st.builds(_valid_grpc, small_prompt, sampling)


def grpc_case() -> st.SearchStrategy:
    """A valid request one time in three (so generations run between refusals), else a wild one."""
    return st.one_of(valid_grpc_case, wild_grpc_case(), wild_grpc_case())
