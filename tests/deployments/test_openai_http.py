"""End to end through the official `openai` client against a real Ray Serve stack (2 replicas)."""

from __future__ import annotations

import http.client
import json
import time
from urllib.parse import urlparse

import openai
import pytest
from ray import serve
from serving import APP, ENGINE

from dspark import LLM, SamplingParams

PROMPT = "def wrap(text, width):"


@pytest.fixture(scope="module")
def client(serve_stack):
    return openai.OpenAI(base_url=serve_stack.http_url + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def offline(serve_stack):
    """The offline engine with the served replicas' options: the reference output."""
    return LLM(str(serve_stack.model_dir), **ENGINE)


def test_models_and_health(client, serve_stack):
    assert [m.id for m in client.models.list().data] == [serve_stack.model_name]
    conn = http.client.HTTPConnection(urlparse(serve_stack.http_url).netloc, timeout=30)
    conn.request("GET", "/health")
    assert conn.getresponse().status == 200


def test_completion_equals_offline_greedy(client, offline, serve_stack):
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    expected = offline.generate([PROMPT], params)[0]
    out = client.completions.create(
        model=serve_stack.model_name,
        prompt=PROMPT,
        max_tokens=24,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert out.choices[0].text == expected.text
    assert out.choices[0].finish_reason == "length"
    assert out.usage.prompt_tokens == len(expected.prompt_token_ids) and out.usage.completion_tokens == 24
    assert out.model_extra["dspark"]["speculation"]["rounds"] >= 1


def test_streaming_completion_equals_offline_greedy(client, offline, serve_stack):
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    expected = offline.generate([PROMPT], params)[0]
    chunks = list(
        client.completions.create(
            model=serve_stack.model_name,
            prompt=PROMPT,
            max_tokens=20,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == expected.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 20
    # The last chunk with a choice carries the replica's timing (this host's monotonic clock), in order.
    last = [c for c in chunks if c.choices][-1]
    timing = last.model_extra["dspark"]["timing"]
    stamps = [timing[k] for k in ("received", "admitted", "scheduled", "first_token")]
    assert stamps == sorted(stamps) and stamps[-1] <= time.monotonic()
    assert all("timing" not in (c.model_extra or {}).get("dspark", {}) for c in chunks if c is not last)
    # ... and the id of the replica that ran it (Serve's), one of the app's target replicas.
    states = serve.get_deployment_handle("TargetReplica", APP).broadcast("get_state").results(timeout_s=60)
    assert last.model_extra["dspark"]["replica"] in {state["replica_id"] for state in states}


def test_chat_completion_stream_and_not(client, serve_stack):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Wrap text."}]
    full = client.chat.completions.create(
        model=serve_stack.model_name, messages=messages, max_tokens=12, temperature=0
    )
    assert full.choices[0].message.role == "assistant" and full.usage.completion_tokens >= 1
    streamed = client.chat.completions.create(
        model=serve_stack.model_name, messages=messages, max_tokens=12, temperature=0, stream=True
    )
    chunks = list(streamed)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == full.choices[0].message.content


def test_sampled_request_with_seed_is_reproducible(client, serve_stack):
    kwargs = dict(
        model=serve_stack.model_name, prompt=PROMPT, max_tokens=12, temperature=0.8, top_p=0.9, seed=7
    )
    assert (
        client.completions.create(**kwargs).choices[0].text
        == client.completions.create(**kwargs).choices[0].text
    )


def raw_post(serve_stack, path: str, body: bytes, headers: dict | None = None):
    conn = http.client.HTTPConnection(urlparse(serve_stack.http_url).netloc, timeout=30)
    conn.request("POST", path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
    response = conn.getresponse()
    payload = response.read()
    conn.close()
    return response.status, json.loads(payload) if payload else None


def test_raw_sse_wire_format(serve_stack):
    body = json.dumps({"prompt": PROMPT, "max_tokens": 4, "temperature": 0, "stream": True}).encode()
    conn = http.client.HTTPConnection(urlparse(serve_stack.http_url).netloc, timeout=30)
    conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200 and response.getheader("content-type").startswith("text/event-stream")
    events = [line for line in response.read().decode().split("\n\n") if line]
    assert events[-1] == "data: [DONE]" and all(e.startswith("data: ") for e in events)
