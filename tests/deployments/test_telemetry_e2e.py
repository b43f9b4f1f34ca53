"""Telemetry end to end: a real OTLP/gRPC receiver in this process, the app started with the standard
environment pointing at it (as `OTEL_EXPORTER_OTLP_ENDPOINT=... make serve` does), and requests over
HTTP with a W3C `traceparent` and over gRPC through dspark_client inside a span of the caller's.

Each client's trace id must arrive on spans from two processes (ingress and target replica), whose
GenAI and dspark.* attributes equal the usage and speculation stats of the response; the TTFT
histogram arrives over OTLP; the replica's Prometheus endpoint counts the same speculation.
"""

from __future__ import annotations

import http.client
import json
import secrets
import urllib.request

import pytest
from opentelemetry.sdk.trace import TracerProvider
from prometheus_client.parser import text_string_to_metric_families
from serving import MODEL_NAME, free_port, own_stack, wait_until

import dspark_client
from dspark.telemetry import semconv as sc
from dspark.telemetry.dump import format_trace, traces
from dspark.telemetry.prometheus import PORT_SPAN
from dspark.telemetry.receiver import OTLPReceiver
from router import decisions
from router.sla import DEFAULT_CLASS

PROMPT = "def parse_args(argv):"
MAX_TOKENS = 16


@pytest.fixture(scope="module")
def receiver():
    receiver = OTLPReceiver()
    yield receiver
    receiver.close()


def post(url: str, body: dict, traceparent: str) -> bytes:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json", "traceparent": traceparent}
    )
    return urllib.request.urlopen(request, timeout=120).read()


def request_spans(receiver: OTLPReceiver, trace_id: str, operation: str) -> dict | None:
    """The trace's GenAI spans by process role (ingress, replica) once both arrived, and all its spans."""
    spans = traces(receiver.spans()).get(trace_id, [])
    named = {s.resource.get("dspark.role"): s for s in spans if s.name == f"{operation} {MODEL_NAME}"}
    return {**named, "all": spans} if {"ingress", "replica"} <= set(named) else None


def ttft_count(receiver: OTLPReceiver) -> int:
    """Requests counted by the TTFT histogram: the latest cumulative count of each series, summed."""
    latest = {tuple(sorted(p.attributes.items())): p.count for p in receiver.points(sc.TTFT)}
    return sum(latest.values())


def scrape_replica(first_port: int) -> str:
    """The replica's /metrics text. Its endpoint binds the first free port from the configured one
    upward (replicas sharing a node), so a port another process took between `free_port()` and the
    replica's start moves it up: scan the span for the exposition that carries our namespace."""
    for port in range(first_port, first_port + PORT_SPAN):
        try:
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
        except (OSError, http.client.HTTPException, UnicodeDecodeError):  # nothing there, or not HTTP/1
            continue
        if "dspark:spec_decode_num_drafts_total" in text:
            return text
    raise AssertionError(f"no replica Prometheus endpoint in [{first_port}, {first_port + PORT_SPAN})")


def check_request(
    spans: dict, operation: str, usage: dict, speculation: dict, response_id: str, client_span: str
) -> None:
    ingress, replica = spans["ingress"], spans["replica"]
    assert ingress.resource["process.pid"] != replica.resource["process.pid"]  # two processes
    assert replica.parent_span_id == ingress.span_id and replica.kind == "INTERNAL"
    if ingress.kind == "INTERNAL":  # HTTP: the child of FastAPI's server span, which continued the client's
        (server,) = [s for s in spans["all"] if s.span_id == ingress.parent_span_id]
        assert server.kind == "SERVER" and server.name.startswith("POST /v1/")
        assert server.resource["process.pid"] == ingress.resource["process.pid"]
        assert server.attributes["http.response.status_code"] == 200
        assert server.parent_span_id == client_span
    else:  # gRPC: the server span itself
        assert ingress.kind == "SERVER" and ingress.parent_span_id == client_span
    for span in (ingress, replica):
        a = span.attributes
        assert (a[sc.GEN_AI_OPERATION_NAME], a[sc.GEN_AI_PROVIDER_NAME]) == (operation, "dspark")
        assert (a[sc.GEN_AI_REQUEST_MODEL], a[sc.GEN_AI_REQUEST_MAX_TOKENS]) == (MODEL_NAME, MAX_TOKENS)
        assert (a[sc.GEN_AI_REQUEST_TEMPERATURE], a[sc.GEN_AI_REQUEST_SEED]) == (0.0, 7)
        assert a[sc.GEN_AI_USAGE_INPUT_TOKENS] == usage["prompt_tokens"]
        assert a[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == usage["completion_tokens"]
        assert a[sc.GEN_AI_RESPONSE_FINISH_REASONS] == ["length"]
        assert a[sc.ROUNDS] == speculation["rounds"] > 0
        assert a[sc.VERIFIED_TOKENS] == speculation["drafted_tokens"]
        assert a[sc.ACCEPTED_TOKENS] == speculation["accepted_tokens"]
        assert a[sc.MEAN_ACCEPT_LENGTH] == pytest.approx(speculation["mean_accept_length"], abs=1e-4)
        # No request named an SLA class: each ran under the app's default one (router/sla.py).
        assert (a[sc.DRAFTER], a[sc.BLOCK_LENGTH], a[sc.SLA_CLASS]) == ("ngram", 4, DEFAULT_CLASS)
        assert a[sc.TIME_TO_FIRST_TOKEN] > 0 and a[sc.TIME_PER_OUTPUT_TOKEN] > 0
        if "proposed_tokens" in speculation:  # the HTTP body carries all of them
            assert a[sc.DRAFTED_TOKENS] == speculation["proposed_tokens"]
            assert a[sc.ACCEPTED_BY_POSITION] == (speculation["accepted_by_position"] + [0] * 4)[:4]
    assert ingress.attributes[sc.GEN_AI_RESPONSE_ID] == response_id
    # The SLA router's decision, with its scores, is an event of the ingress's span (one replica here).
    (route,) = [attrs for name, _, attrs in ingress.events if name == decisions.EVENT]
    assert route["dspark.route.action"] == "route"
    assert list(route["dspark.route.ranking"]) == [route["dspark.route.placed_on"]]
    (scores,) = json.loads(route["dspark.route.scores"]).values()
    assert scores["tier"] in ("fresh", "stale", "unknown") and scores["load"] >= 0
    # Every speculation attribute on the replica's span reached the ingress's, unchanged.
    dspark = {k: v for k, v in replica.attributes.items() if k.startswith("dspark.") and k != sc.REPLICA_ID}
    assert {k: ingress.attributes[k] for k in dspark if k != sc.REQUEST_ID} == {
        k: v for k, v in dspark.items() if k != sc.REQUEST_ID
    }
    # Engine steps, at rate 1: one event per decoding step of this request, each with its share.
    rounds = [attrs for name, _, attrs in replica.events if sc.STEP_REQUEST_VERIFIED in attrs]
    assert len(rounds) == speculation["rounds"]
    assert sum(r[sc.STEP_REQUEST_ACCEPTED] for r in rounds) == speculation["accepted_tokens"]
    assert replica.resource["dspark.replica.id"] and replica.resource["dspark.node.id"]
    assert replica.resource["service.name"] == "dspark-e2e"


def test_traces_and_metrics_from_client_to_engine_step(qwen3_dir, receiver):
    prometheus_port = free_port()
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_SERVICE_NAME": "dspark-e2e",
        "OTEL_BSP_SCHEDULE_DELAY": "200",  # ms: spans leave quickly
        "DSPARK_PROMETHEUS_PORT": str(prometheus_port),
    }
    # The rest through the app config's telemetry block (runtime_env of each deployment).
    telemetry = {"step_sample_rate": 1.0, "metric_export_interval_ms": 500}
    sampling = {"max_tokens": MAX_TOKENS, "temperature": 0, "seed": 7, "ignore_eos": True}
    with own_stack(qwen3_dir, env, num_replicas=1, num_ingress_replicas=1, telemetry=telemetry) as stack:
        # HTTP: the client's W3C traceparent, a plain completion and a streamed chat.
        http_trace, parent = secrets.token_hex(16), secrets.token_hex(8)
        traceparent = f"00-{http_trace}-{parent}-01"
        url = f"{stack.http_url}/v1/completions"
        body = json.loads(post(url, {"prompt": PROMPT, **sampling}, traceparent))
        chat_trace, chat_parent = secrets.token_hex(16), secrets.token_hex(8)
        chunks = post(
            f"{stack.http_url}/v1/chat/completions",
            {"messages": [{"role": "user", "content": PROMPT}], "stream": True, **sampling},
            f"00-{chat_trace}-{chat_parent}-01",
        ).decode()
        chat_last = json.loads([line for line in chunks.splitlines() if line.startswith("data: {")][-1][6:])

        # gRPC through dspark_client, inside a span of the caller's own.
        with dspark_client.Client(stack.grpc_target, timeout_s=120) as client:
            with TracerProvider().get_tracer("caller").start_as_current_span("caller") as caller:
                completion = client.generate(PROMPT, request_id="grpc-1", **sampling)
        grpc_trace = f"{caller.get_span_context().trace_id:032x}"

        http_spans = wait_until(
            lambda: request_spans(receiver, http_trace, "text_completion"), what="HTTP spans"
        )
        chat_spans = wait_until(lambda: request_spans(receiver, chat_trace, "chat"), what="chat spans")
        grpc_spans = wait_until(
            lambda: request_spans(receiver, grpc_trace, "text_completion"), what="gRPC spans"
        )
        wait_until(lambda: ttft_count(receiver) == 3, timeout_s=60, what="the TTFT of every request")
        scraped = scrape_replica(prometheus_port)

    speculation = body["dspark"]["speculation"]
    check_request(http_spans, "text_completion", body["usage"], speculation, body["id"], parent)
    assert http_spans["ingress"].attributes[sc.GEN_AI_REQUEST_STREAM] is False
    # A streamed chat's last chunk carries the speculation stats; its usage (without include_usage)
    # is checked against the replica's own count of the prompt.
    chat_prompt_tokens = chat_spans["replica"].attributes[sc.GEN_AI_USAGE_INPUT_TOKENS]
    check_request(
        chat_spans,
        "chat",
        {"prompt_tokens": chat_prompt_tokens, "completion_tokens": MAX_TOKENS},
        chat_last["dspark"]["speculation"],
        chat_last["id"],
        chat_parent,
    )
    spec = completion.speculation
    check_request(
        grpc_spans,
        "text_completion",
        {
            "prompt_tokens": completion.usage.prompt_tokens,
            "completion_tokens": completion.usage.completion_tokens,
        },
        {
            "rounds": spec.rounds,
            "drafted_tokens": spec.drafted_tokens,
            "accepted_tokens": spec.accepted_tokens,
            "mean_accept_length": spec.mean_accept_length,
        },
        "grpc-1",
        f"{caller.get_span_context().span_id:016x}",
    )
    (point, *_) = receiver.points(sc.TTFT)
    assert point.bounds == list(sc.TTFT_BUCKETS) and point.resource["dspark.role"] == "replica"

    # The replica's Prometheus endpoint counted the same rounds, under vLLM's name in our namespace.
    samples: dict[str, list] = {}
    for family in text_string_to_metric_families(scraped):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(sample.value)
    rounds = body["dspark"]["speculation"]["rounds"] + chat_last["dspark"]["speculation"]["rounds"]
    assert samples["dspark:spec_decode_num_drafts_total"] == [rounds + spec.rounds]
    assert sum(samples["gen_ai_server_time_to_first_token_seconds_count"]) == 3  # text_completion, chat

    print("\n" + format_trace(traces(receiver.spans())[http_trace]))  # the sample trace of the closing note
