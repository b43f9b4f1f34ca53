"""Smoke test of the SGLang backend on a GPU host with SGLang installed (scripts/install.sh VENV dev,sglang).

    python scripts/sglang_smoke.py [--workdir DIR] [--requests 8] [--tp 1]

Builds a tiny local target (Qwen3 architecture, random weights, a tokenizer trained on a few standard-
library files) and an untrained DSpark drafter for it in DeepSpec's layout, with the test fixtures'
builders (no hub), starts the SGLang replica through build_app on a local Ray Serve with SGLang's real
engine (compact verify mode, with a made-up SPS table in SGLang's format: without a profiled table SGLang
verifies every drafted token and ignores the budget), streams concurrent requests over HTTP, checks that
every request finished with non-zero speculation stats from SGLang, then moves the draft budget, reads it
back from the replica's routing stats, checks that a request verifies fewer drafts under it, and that a
cap SGLang cannot apply is refused by name. Exits non-zero on the first failed check. Acceptance is low
(the drafter is untrained): this checks the plumbing on real SGLang, not speed.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


GAMMA = 4


def build_models(workdir: Path) -> tuple[Path, Path, Path]:
    from deployments.sglang_artifacts import write_sps_table
    from dspark.cost_table import CostTable
    from tests.conftest import build_checkpoint, train_tokenizer
    from tests.drafter_service.drafter_fixtures import save_untrained_dspark

    target = build_checkpoint(workdir / "target", "qwen3", train_tokenizer())
    drafter = save_untrained_dspark(target, workdir / "drafters" / "dspark", gamma=GAMMA)
    # Made up, not measured (SGLang's profiler measures its own): enough for SGLang to schedule budgets.
    sps = write_sps_table(CostTable([1, 16, 64], [400.0, 380.0, 250.0], max_tokens=128), workdir / "sps.json")
    return target, drafter, sps


def stream(url: str, prompt: str, max_tokens: int) -> dict:
    """One streamed completion; returns the last chunk (carrying `dspark.speculation`) and the text."""
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "stream": True, "temperature": 0,
                       "ignore_eos": True}).encode()  # fmt: skip
    request = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
    text, last = "", None
    with urllib.request.urlopen(request, timeout=300) as response:
        for line in response:
            line = line.decode().strip()
            if line.startswith("data: ") and line != "data: [DONE]":
                last = json.loads(line[len("data: ") :])
                text += last["choices"][0]["text"] if last.get("choices") else ""
    return {"text": text, "last": last}


def check(condition: bool, what: str) -> None:
    print(("ok   " if condition else "FAIL ") + what, flush=True)
    if not condition:
        raise SystemExit(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--port", type=int, default=8123)
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="sglang-smoke-"))

    import ray
    from ray import serve

    from deployments.app import build_app

    target, drafter, sps = build_models(workdir)
    print(f"models in {workdir}", flush=True)
    config = {
        "model": str(target),
        "backend": "sglang",
        "tensor_parallel_size": args.tp,
        "engine": {
            "drafter": "dspark",
            "drafter_model": str(drafter),
            "num_speculative_tokens": GAMMA,
            "max_num_seqs": 16,
            "dtype": "bfloat16",
        },  # fmt: skip
        "sglang": {
            "verify_mode": "compact",
            "sps_table": str(sps),
            "server_args": {"mem_fraction_static": 0.5},
        },
    }
    ray.init()
    serve.start(http_options={"host": "127.0.0.1", "port": args.port})
    try:
        serve.run(build_app(config), name="smoke", route_prefix="/")
        url = f"http://127.0.0.1:{args.port}"
        results: list[dict] = []
        threads = [
            threading.Thread(target=lambda i=i: results.append(stream(url, f"def f{i}(x):", 48)))
            for i in range(args.requests)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        check(len(results) == args.requests, f"{args.requests} concurrent streams finished")
        for result in results:
            spec = result["last"]["dspark"]["speculation"]
            check(spec["rounds"] > 0 and spec["drafted_tokens"] > 0, f"speculation stats from SGLang: {spec}")

        handle = serve.get_deployment_handle("TargetReplica", app_name="smoke")
        applied = handle.set_draft_budget.remote({"max_request_tokens": 2}).result()
        check(
            applied["sglang"]["dspark_force_budget_frac"] is not None, f"budget applied: {applied['sglang']}"
        )
        spec = stream(url, "import os\n", 32)["last"]["dspark"]["speculation"]
        check(
            spec["drafted_tokens"] < spec["rounds"] * GAMMA, f"fewer drafts verified under the budget: {spec}"
        )
        stats = handle.record_routing_stats.remote().result()
        check(stats["draft_budget"] == applied, "the budget reads back from the replica")
        check(stats["finished_requests"] >= args.requests + 1 and stats["healthy"], f"routing stats: {stats}")
        try:
            handle.set_draft_budget.remote({"max_step_tokens": 8}).result()
            check(False, "a per-step cap is refused")
        except Exception as exc:
            check("max_step_tokens" in str(exc), "a per-step cap is refused by name")
        cleared = handle.set_draft_budget.remote({}).result()
        check(cleared["sglang"]["dspark_force_budget_frac"] is None, "the budget override clears")
        print("SGLang smoke passed", flush=True)
    finally:
        serve.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    main()
