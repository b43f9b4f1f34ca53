"""bench/http_failure.py: an HTTP error the benchmarks stop on says whether Serve's proxy answered it."""

from __future__ import annotations

import asyncio
import http.server
import threading
from datetime import datetime

import openai
import pytest
from serving import serve_stack  # noqa: F401  (the session's shared Ray Serve stack)

from bench.http_failure import BODY_CHARS, ServedRequestError, described, from_openai
from sim.workload import Request


def test_the_request_id_header_in_any_case_names_the_proxy_and_the_body_is_cut():
    line = described(503, {"X-Request-ID": "abc", "Content-Type": "text/plain"}, "x" * 1000)
    assert line.startswith("HTTP 503 through Serve's proxy (x-request-id abc:")
    assert "content-type text/plain" in line and repr("x" * BODY_CHARS) in line and "x" * 301 not in line
    line = described(500, {}, None, sent_at=datetime(2026, 12, 6, 11, 43, 6, 21000).timestamp())
    assert "not through Serve's request handling (no x-request-id)" in line
    assert "content-type -; body unread; sent 2026-12-06 11:43:06.021000" in line


def test_an_error_from_the_served_stack_is_described_as_through_serves_proxy(serve_stack):  # noqa: F811
    client = openai.OpenAI(base_url=f"{serve_stack.http_url}/v1", api_key="-", max_retries=0)
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(
            model=serve_stack.model_name, prompt="def f(x):", max_tokens=-1, stream=True
        )
    line = str(from_openai(err.value))
    assert line.startswith("HTTP 400 through Serve's proxy (x-request-id ")
    assert "max_tokens" in line  # our error body (deployments/errors.py), read from the streamed response


class _Bare500(http.server.BaseHTTPRequestHandler):
    """An HTTP server's own answer to a failure, as no Serve response is: 500, no request id, no body."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["content-length"]))
        self.send_response(500)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def test_a_bare_500_is_described_as_not_through_serves_request_handling():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Bare500)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{server.server_port}/v1", api_key="-", max_retries=0
        )
        with pytest.raises(openai.InternalServerError) as err:
            client.completions.create(model="m", prompt="x", max_tokens=1, stream=True)
    finally:
        server.shutdown()
        server.server_close()
    line = str(from_openai(err.value, sent_at=0.0))
    assert line.startswith("HTTP 500 not through Serve's request handling (no x-request-id)")
    assert "body ''" in line and line.endswith(f"sent {datetime.fromtimestamp(0.0):%Y-%m-%d %H:%M:%S.%f}")


def test_the_benchmarks_clients_raise_the_description_for_an_error_they_do_not_expect(serve_stack):  # noqa: F811
    from bench.serving_cost import _drive as closed_loop
    from bench.sim_validate import _drive as trace

    url, model = f"{serve_stack.http_url}/v1", serve_stack.model_name
    assert asyncio.run(closed_loop(url, model, ["def f(x):"], 2, 1))[0] == 2  # a valid request runs
    with pytest.raises(ServedRequestError, match=r"^HTTP 400 through Serve's proxy .*max_tokens"):
        asyncio.run(closed_loop(url, model, ["def f(x):"], -1, 1))

    async def replay(max_tokens: int) -> Request:
        req = Request(
            rid=0, arrival=0.0, prompt_tokens=4, max_tokens=max_tokens, sla_class="standard", domain="code"
        )
        client = openai.AsyncOpenAI(base_url=url, api_key="-", max_retries=0)
        try:
            await trace(client, model, [req], ["def f(x):"])
        finally:
            await client.close()
        return req

    assert asyncio.run(replay(2)).outcome == "done"
    with pytest.raises(ServedRequestError, match=r"^HTTP 400 through Serve's proxy .*max_tokens"):
        asyncio.run(replay(-1))
