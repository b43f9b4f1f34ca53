"""What an HTTP error from the served stack says of where it came from, for a benchmark that stops on one.

A benchmark that drives the stack over HTTP stops on an error it does not expect, and the client's
exception alone ("Error code: 500") does not say which process answered. One did in the validation sitting
of 2026-12-06 11:35, right after a redeploy, and neither the proxy's nor the ingress' access log held the
request. Serve's proxy stamps every response that passes through its ASGI app with the request's id
(`X-Request-ID`, ray/serve/_private/http_util.py RequestIdMiddleware), whatever its status: a response
without one never reached Serve's request handling (the HTTP server's own answer to an exception raised
before it, or not this stack at all), one with it did, and the id finds it in the proxy's and the
ingress' access logs (ray's session logs, serve/).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

BODY_CHARS = 300  # enough for our JSON errors (deployments/errors.py) and Serve's plain-text ones


class ServedRequestError(RuntimeError):
    """A request the benchmark did not expect to fail, with what its response says of its source."""


def described(status: int, headers: Mapping[str, str], body: str | None, sent_at: float | None = None) -> str:
    """One line: the status, who answered (by X-Request-ID), the content type and the body's start.
    `headers`: the response's, any case. `sent_at`: when the request went out (Unix time), shown in local
    time as Ray's logs write theirs, to find the request beside them."""
    lower = {k.lower(): v for k, v in headers.items()}
    request_id = lower.get("x-request-id")
    source = (
        f"through Serve's proxy (x-request-id {request_id}: in the proxy's and the ingress' access logs)"
        if request_id
        else "not through Serve's request handling (no x-request-id)"
    )
    text = "unread" if body is None else repr(body[:BODY_CHARS])
    when = "" if sent_at is None else f"; sent {datetime.fromtimestamp(sent_at):%Y-%m-%d %H:%M:%S.%f}"
    return f"HTTP {status} {source}; content-type {lower.get('content-type', '-')}; body {text}{when}"


def from_openai(err, sent_at: float | None = None) -> ServedRequestError:
    """The error to raise for an `openai.APIStatusError`: its response described."""
    import httpx2  # the openai client's HTTP library

    response = err.response
    try:
        body = response.text
    except httpx2.ResponseNotRead:  # a streamed response closed before its body was read
        body = None
    return ServedRequestError(described(response.status_code, dict(response.headers), body, sent_at))
