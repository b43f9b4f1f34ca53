"""A client that leaves mid-stream aborts its request on the replica and frees its KV blocks."""

from __future__ import annotations

import asyncio
import http.client
import json
from urllib.parse import urlparse

from serving import APP, wait_until

from deployments.replicas import routing_stats


def replica_stats() -> list[dict]:
    return asyncio.run(routing_stats(APP, "TargetReplica"))


def test_http_disconnect_mid_stream_frees_the_request(serve_stack):
    before = sum(s["aborted_requests"] for s in replica_stats())
    # Sampled, long and without EOS: it cannot finish in the moments before the client hangs up.
    body = {
        "prompt": "import os\n",
        "max_tokens": 480,
        "temperature": 1.0,
        "ignore_eos": True,
        "stream": True,
    }
    conn = http.client.HTTPConnection(urlparse(serve_stack.http_url).netloc, timeout=30)
    conn.request(
        "POST",
        "/v1/completions",
        body=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    response = conn.getresponse()
    assert response.status == 200
    assert response.readline().startswith(b"data: ")  # the stream is running
    conn.sock.close()  # hang up without reading on
    conn.close()

    def freed():
        stats = replica_stats()
        idle = all(
            s["running_requests"] == 0 and s["kv_unreserved_pages"] == s["kv_total_pages"] for s in stats
        )
        return idle and sum(s["aborted_requests"] for s in stats) == before + 1

    wait_until(freed, timeout_s=30, what="the abandoned request to be aborted and its KV blocks freed")
