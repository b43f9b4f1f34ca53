"""Parsing an HTTP body (pure): the guards json.loads lacks, each refusal a `body` error."""

from __future__ import annotations

import json
import time

import pytest

from deployments.validation import MAX_JSON_DEPTH, Limits, nesting_depth, parse_json_body
from dspark.errors import InvalidRequestError

LIMITS = Limits(max_request_bytes=4096)
BIG = Limits(max_request_bytes=1 << 20)


def nested(depth: int) -> bytes:
    return b'{"prompt": ' + b"[" * (depth - 1) + b"1" + b"]" * (depth - 1) + b"}"


@pytest.mark.parametrize(
    "raw, words",
    [
        (b"{not json", "not valid JSON"),
        (b"", "not valid JSON"),
        (b"[1, 2]", "must be a JSON object, got array"),
        (b'"text"', "must be a JSON object, got string"),
        (b"null", "must be a JSON object, got null"),
        (b"\xff\xfe", "not valid UTF-8 (byte 0xff at offset 0)"),
        (b'{"prompt": "\xed\xb3\xbf"}', "not valid UTF-8 (byte 0xed at offset 12)"),  # a surrogate as bytes
        ('{"prompt": "x"}'.encode("utf-16"), "not valid UTF-8"),
        (b'\xef\xbb\xbf{"prompt": "x"}', "not valid JSON"),  # a byte-order mark
        (b'{"prompt": "x", "temperature": NaN}', "NaN is not valid JSON"),
        (b'{"prompt": "x", "temperature": Infinity}', "Infinity is not valid JSON"),
        (b'{"prompt": "x", "temperature": -Infinity}', "-Infinity is not valid JSON"),
        (b'{"prompt": "x", "unknown": [NaN]}', "NaN is not valid JSON"),
        (b'{"prompt": "x", "seed": ' + b"9" * 5000 + b"}", "an integer literal of 5000 digits"),
        (b'{"prompt": "a\x00b"}', "not valid JSON (Invalid control character"),
        (b"[" * 100_000, f"nesting deeper than {MAX_JSON_DEPTH} levels"),
        (b'{"a": ' * 50_000, f"nesting deeper than {MAX_JSON_DEPTH} levels"),
        (nested(MAX_JSON_DEPTH + 1), f"nesting deeper than {MAX_JSON_DEPTH} levels"),
    ],
)
def test_malformed_bodies(raw, words):
    with pytest.raises(InvalidRequestError) as err:
        parse_json_body(raw, BIG)
    assert err.value.field == "body" and words in err.value.message, err.value


def test_what_json_allows_still_parses():
    value = parse_json_body(nested(MAX_JSON_DEPTH), BIG)["prompt"]
    for _ in range(MAX_JSON_DEPTH - 2):
        value = value[0]
    assert value == [1]
    body = parse_json_body(
        b'{"prompt": "\\u0000\\u202e\\ud83d\\ude00 [[[{{{", "seed": -9223372036854775808}', BIG
    )
    assert body == {"prompt": "\x00\u202e\U0001f600 [[[{{{", "seed": -(2**63)}
    assert parse_json_body(b'{"temperature": 1e400}', BIG) == {
        "temperature": float("inf")
    }  # the schema refuses
    assert parse_json_body(b'{"prompt": "\\udcff"}', BIG) == {"prompt": "\udcff"}  # the schema names it


def test_oversized_body():
    with pytest.raises(InvalidRequestError, match="exceed the limit") as err:
        parse_json_body(json.dumps({"prompt": "x" * 5000}).encode(), LIMITS)
    assert err.value.field == "body"


@pytest.mark.parametrize(
    "text, depth",
    [
        ("{}", 1),
        ('{"a": [1, {"b": []}]}', 4),
        ('{"a": "[[[[[[[["}', 1),  # brackets inside strings do not count
        ('{"a": "\\"[[[[", "b": ["]]]"]}', 2),  # nor behind escaped quotes
        ('"\\\\"[[', 2),  # an escaped backslash ends before the quote
        ('"unterminated [[[[', 0),
        ("]]]][", 0),  # unbalanced: json.loads fails without recursing
    ],
)
def test_nesting_depth(text, depth):
    assert nesting_depth(text) == depth


@pytest.mark.parametrize(
    "text",
    ['"' + '\\"' * 500_000, "[]" * 500_000, '"' * 1_000_000, '"a' * 500_000, "\\" * 1_000_000],
)
def test_nesting_depth_is_linear_on_adversarial_megabytes(text):
    start = time.perf_counter()
    nesting_depth(text)
    assert time.perf_counter() - start < 2.0  # a quadratic scan takes minutes here
