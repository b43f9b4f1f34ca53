"""Closed-loop recalibration end to end through real Ray Serve: two replicas draft with the tiny trained
DSpark drafter, and the workload shifts from greedy to sampling at temperature 1. The drafter holds no
STS set for that temperature, so its confidences there are off (pooled ECE ~0.07 against the 0.05
threshold); the controller pools the replicas' rounds, detects it, refits the temperatures and pushes
them to both replicas. Greedy output equals the target alone's before and after.

The controller also hosts its OTLP receiver, which the replicas export to (build_app points them at it):
their calibration-error gauge, which no broadcast reading carries, reaches the controller's view.
"""

from __future__ import annotations

import json
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from ray import serve
from serving import MODEL_NAME, app_args, free_port, serve_stack, wait_until  # noqa: F401

from deployments.app import build_app
from dspark import LLM, SamplingParams

APP = "sts"
TOKEN = "sts-operator"
GAMMA = 4
GREEDY_PROMPTS = ["def parse(text):", "class Wrapper:"]
SAMPLED_PROMPTS = ["import bisect\n", "The river", "for i in range(", "x = [", "return self.", "# note"]
ENGINE = {
    "drafter": "dspark",
    "scheduler": "dspark",
    "num_speculative_tokens": GAMMA,
    "draft_gate": False,  # on a CPU the gate may decline drafting; this test needs rounds that draft
    "num_kv_pages": 128,
    "max_num_seqs": 4,
    "cost_table_profile": "coarse",
}


def post(url: str, path: str, body: dict, token: str | None = None) -> dict:
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {token}"} if token else {})
    request = urllib.request.Request(f"{url}/{APP}{path}", json.dumps(body).encode(), headers)
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def state(url: str) -> dict:
    request = urllib.request.Request(
        f"{url}/{APP}/admin/controller/state", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def greedy_texts(url: str) -> list[str]:
    body = {"model": MODEL_NAME, "max_tokens": 24, "temperature": 0, "ignore_eos": True}
    return [post(url, "/v1/completions", {**body, "prompt": p})["choices"][0]["text"] for p in GREEDY_PROMPTS]


def sampled(url: str, seed: int) -> None:
    body = {"model": MODEL_NAME, "max_tokens": 32, "temperature": 1.0, "ignore_eos": True, "seed": seed}
    for prompt in SAMPLED_PROMPTS:
        post(url, "/v1/completions", {**body, "prompt": prompt})


@pytest.fixture(scope="module")
def drifting(serve_stack, stack):  # noqa: F811
    controller = {
        "period_s": 1.0,
        "admin_tokens": [TOKEN],
        "policy": {"collapse_acceptance": 0.0},
        "sts_min_rounds": 150,
        "otlp_port": free_port(),
    }
    args = app_args(stack, engine=ENGINE, controller=controller)
    serve.run(build_app(args), name=APP, route_prefix=f"/{APP}")
    try:
        yield serve_stack.http_url
    finally:
        serve.delete(APP)


def test_calibration_drift_is_detected_refitted_and_pushed_losslessly(drifting, stack):
    expected = [
        o.text
        for o in LLM(str(stack), num_kv_pages=128).generate(
            GREEDY_PROMPTS, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
        )
    ]
    replicas = wait_until(lambda: len(state(drifting)["replicas"]) == 2 and state(drifting)["replicas"])
    assert all(r["sts_temperatures"] == {} for r in replicas.values())  # no STS set at any temperature
    assert greedy_texts(drifting) == expected

    # The shift: sampled requests at temperature 1, from both replicas' share of the traffic.
    seeds = iter(range(1000))

    def refitted():
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda s: sampled(drifting, s), [next(seeds), next(seeds)]))
        refits = [r for r in state(drifting)["refits"] if r["temperature"] == 1.0]
        return refits[0] if refits else None

    refit = wait_until(refitted, timeout_s=300, interval_s=0.0, what="an STS refit at temperature 1")
    assert refit["ece_before"] > 0.05 and refit["ece_before"] - refit["ece_after"] >= 0.005
    assert len(refit["temperatures"]) == GAMMA and refit["temperatures"] != [1.0] * GAMMA

    # Pushed to every replica: each reports holding the refitted set.
    def pushed():
        held = [r["sts_temperatures"].get("1.0") for r in state(drifting)["replicas"].values()]
        return len(held) == 2 and all(h is not None for h in held) and held

    for held in wait_until(pushed, timeout_s=60, what="the refitted set on both replicas"):
        assert held == pytest.approx(refit["temperatures"], abs=1e-5)
    assert greedy_texts(drifting) == expected  # lossless: which drafts are verified changed, not how

    # The replicas' OTLP export reached the controller: the calibration gauge is only sent that way, and
    # so are the requests' spans (exported on their own schedule, so they may follow the metrics).
    wait_until(
        lambda: (
            (s := state(drifting))["otlp"]["received"]["points"] > 0
            and s["otlp"]["received"]["spans"] > 0
            and all(r["telemetry"]["calibration_error"] is not None for r in s["replicas"].values())
            and s
        ),
        timeout_s=60,
        what="the replicas' calibration gauges and spans in the controller's view",
    )
