"""A short client session against a running stack: stream a completion over gRPC, print the speculation
stats and the replicas' loads, then the same prompt through the OpenAI HTTP API.

    python -m deployments.demo [--grpc localhost:9000] [--http http://localhost:8000]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.request

import dspark_client

PROMPT = "def parse_args(argv):\n"


def wait_ready(client: dspark_client.Client, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if client.health(timeout=5) == "SERVING":
                return
        except dspark_client.DSparkClientError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"the service did not become ready within {timeout_s:.0f}s")
        time.sleep(0.5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grpc", default="localhost:9000")
    parser.add_argument("--http", default="http://localhost:8000")
    parser.add_argument("--prompt", default=PROMPT)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--seed", type=int, default=1, help="sampled yet reproducible")
    args = parser.parse_args(argv)

    with dspark_client.Client(args.grpc, timeout_s=120) as client:
        wait_ready(client)
        info = client.model_info()
        print(
            f"model {info.model}: drafter {info.drafter} (gamma {info.num_speculative_tokens}), "
            f"{info.num_replicas} replicas, context {info.max_model_len}\n"
        )
        print("--- gRPC stream " + "-" * 50)
        print(args.prompt, end="", flush=True)
        started = time.perf_counter()
        first_token_s = None
        sampling = dict(max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed)
        with client.stream(args.prompt, **sampling) as stream:
            for delta in stream:
                first_token_s = first_token_s or time.perf_counter() - started
                print(delta.text, end="", flush=True)
        elapsed = time.perf_counter() - started
        out = stream.completion
        spec = out.speculation
        print("\n" + "-" * 66)
        usage = out.usage
        print(f"finish: {out.finish_reason}; tokens: {usage.prompt_tokens} in, {usage.completion_tokens} out")
        print(f"time to first token {first_token_s or 0:.3f}s; {usage.completion_tokens / elapsed:.1f} tok/s")
        accept = spec.accepted_tokens / spec.drafted_tokens if spec.drafted_tokens else 0.0
        print(
            f"speculation: {spec.rounds} verify rounds, {spec.drafted_tokens} drafted tokens verified, "
            f"{spec.accepted_tokens} accepted ({accept:.0%}); "
            f"tau = {spec.mean_accept_length:.2f} tokens/round"
        )
        for load in client.loads():
            print(
                f"replica {load.replica_id}: running {load.running_requests}, "
                f"KV headroom {load.kv_headroom:.0%}, recent tau {load.recent_tau:.2f}, "
                f"budget {load.draft_budget_json}"
            )

    print("\n--- OpenAI HTTP " + "-" * 50)
    body = {
        "model": info.model,
        "prompt": args.prompt,
        "max_tokens": 48,
        "temperature": args.temperature,
        "seed": args.seed,
    }
    request = urllib.request.Request(
        args.http + "/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        reply = json.load(response)
    print(args.prompt + reply["choices"][0]["text"])
    print(f"usage {reply['usage']}; speculation {reply['dspark']['speculation']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
