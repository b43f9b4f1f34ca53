"""Property: no input makes the served stack fail. Random HTTP bodies and gRPC messages (edge_strategies.py)
go to the real Ray Serve stack; every answer is a success or a refusal naming a field, never a 5xx,
INTERNAL or UNKNOWN, never a hang; and a greedy request afterwards gives the text it gave before.

Bounded and reproducible: derandomized, a fixed number of examples, no shrinking (each example is a
real request). Run with `-s` to see the counts.
"""

from __future__ import annotations

import http.client
import json
import re
from collections import Counter
from datetime import timedelta
from urllib.parse import urlparse

import grpc
from edge_strategies import grpc_case, http_case
from hypothesis import HealthCheck, Phase, given, settings

from dspark_client.proto import GenerationStub
from dspark_client.types import build_request

EXAMPLES = 300  # per surface: about 10 s each on an idle 2-core machine
REQUEST_TIMEOUT_S = 30.0  # a request still unanswered by then is a hang
FUZZ = settings(
    max_examples=EXAMPLES,
    derandomize=True,
    database=None,
    phases=[Phase.generate],
    deadline=timedelta(seconds=REQUEST_TIMEOUT_S),
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
)
GREEDY = {"prompt": "def wrap(text, width):", "max_tokens": 12, "temperature": 0, "ignore_eos": True}
REFUSALS = {400, 429}  # bad input, overload; 409 needs concurrency and 401 keys, which the fuzz never has
GRPC_REFUSALS = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED}
FIELD_FIRST = re.compile(r"^[a-z_]+(\[\d+\]|\.[a-z_]+)*: ")  # "messages[0].content: must be ..."


def post(stack, path: str, body: bytes) -> tuple[int, str, bytes]:
    conn = http.client.HTTPConnection(urlparse(stack.http_url).netloc, timeout=REQUEST_TIMEOUT_S)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, response.getheader("content-type", ""), response.read()
    finally:
        conn.close()


def check_http_answer(status: int, content_type: str, payload: bytes) -> str | None:
    """The field a refusal names (None for a success), after checking the answer's shape."""
    if status in REFUSALS:
        error = json.loads(payload)["error"]
        assert set(error) == {"message", "type", "param", "code"}
        if status == 400:
            assert FIELD_FIRST.match(error["message"]) and error["message"].startswith(error["param"] + ": ")
        return error["param"]
    assert status == 200, (status, payload[:300])
    if content_type.startswith("text/event-stream"):
        events = [e.removeprefix("data: ") for e in payload.decode().split("\n\n") if e]
        assert events[-1] == "[DONE]"
        assert not any("error" in json.loads(e) for e in events[:-1]), payload[-300:]  # no failure mid-stream
    else:
        assert json.loads(payload)["choices"][0]["finish_reason"] in ("stop", "length")
    return None


def greedy_text(stack) -> str:
    status, _, payload = post(stack, "/v1/completions", json.dumps(GREEDY).encode())
    assert status == 200
    return json.loads(payload)["choices"][0]["text"]


def test_http_fuzz_never_fails_the_server(serve_stack):
    before = greedy_text(serve_stack)
    statuses: Counter[int] = Counter()
    fields: Counter[str] = Counter()

    @FUZZ
    @given(case=http_case())
    def probe(case):
        path, body = case
        status, content_type, payload = post(serve_stack, path, body)
        statuses[status] += 1
        fields[check_http_answer(status, content_type, payload)] += 1

    probe()
    tried = sum(statuses.values())
    print(f"\nHTTP fuzz: {tried} cases, statuses {dict(sorted(statuses.items()))}, server errors 0")
    print(f"HTTP fuzz: fields refused most {[(f, n) for f, n in fields.most_common() if f][:8]}")
    assert tried >= EXAMPLES and statuses[200] > 0 and statuses[400] > 0
    assert greedy_text(serve_stack) == before


def test_grpc_fuzz_never_fails_the_server(serve_stack):
    codes: Counter[str] = Counter()
    with grpc.insecure_channel(serve_stack.grpc_target) as channel:
        stub = GenerationStub(channel)
        greedy = build_request(GREEDY["prompt"], max_tokens=12, temperature=0.0, ignore_eos=True)
        before = "".join(r.delta.text for r in stub.Generate(greedy, timeout=REQUEST_TIMEOUT_S))

        @FUZZ
        @given(request=grpc_case())
        def probe(request):
            try:
                responses = list(stub.Generate(request, timeout=REQUEST_TIMEOUT_S))
            except grpc.RpcError as err:
                codes[err.code().name] += 1
                assert err.code() in GRPC_REFUSALS, (err.code(), err.details())
                if err.code() == grpc.StatusCode.INVALID_ARGUMENT:
                    assert FIELD_FIRST.match(err.details()), err.details()
                return
            codes["OK"] += 1
            assert responses[-1].final.finish_reason in ("stop", "length")

        probe()
        tried = sum(codes.values())
        print(f"\ngRPC fuzz: {tried} cases, codes {dict(sorted(codes.items()))}, server errors 0")
        assert tried >= EXAMPLES and codes["OK"] > 0 and codes["INVALID_ARGUMENT"] > 0
        greedy = build_request(GREEDY["prompt"], max_tokens=12, temperature=0.0, ignore_eos=True)
        assert "".join(r.delta.text for r in stub.Generate(greedy, timeout=REQUEST_TIMEOUT_S)) == before
