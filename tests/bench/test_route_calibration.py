"""The routing benchmark's predicted-vs-realised check: requests found by their traces, per replica."""

from __future__ import annotations

import json

import pytest

from bench.route_calibration import (
    REPLICA_ID,
    REQUEST_ID,
    ROUTE_EVENT,
    Traced,
    predicted_vs_realised,
    request_id,
    traced_requests,
)
from bench.route_workload import Arrival, Outcome, SlaTarget
from dspark.telemetry import semconv
from dspark.telemetry.receiver import ReceivedSpan
from router import decisions
from router.policy import Candidate, Decision, Prediction, ReplicaState


def test_the_attribute_names_are_the_ones_the_serving_code_writes():
    assert (ROUTE_EVENT, REQUEST_ID, REPLICA_ID) == (decisions.EVENT, semconv.REQUEST_ID, semconv.REPLICA_ID)


def span(trace: str, attributes: dict, events: list | None = None) -> ReceivedSpan:
    return ReceivedSpan("s", trace, "0" * 16, "", "INTERNAL", 0, 1, attributes, events or [], 0, {})


def route_event(scores: dict[str, tuple[float, float]], ranking: list[str]) -> tuple[str, int, dict]:
    """The dspark.route event of a real decision: the policy's scores as the ingress records them."""
    candidates = tuple(
        Candidate(ReplicaState(rid, None), 0, Prediction(ttft, tpot, tpot, 0.5))
        for rid, (ttft, tpot) in scores.items()
    )
    decision = Decision("route", tuple(ranking), "meets the SLA", candidates=candidates).to_dict()
    return (ROUTE_EVENT, 0, decisions.event_attributes(decision))


def test_a_request_is_traced_to_the_replica_it_ran_on_with_the_prediction_for_that_replica():
    ingress = span("t1", {}, [route_event({"a": (0.1, 0.02), "b": (0.3, 0.05)}, ["a", "b"])])
    # Serve placed it on "b", the second choice ("a" was full): b's prediction is the one to check.
    replica = span("t1", {REQUEST_ID: "x.0", REPLICA_ID: "b"})
    plain = span("t2", {REQUEST_ID: "x.1", REPLICA_ID: "a"})  # under Serve's router: no decision
    lone_ingress = span("t3", {}, [route_event({"a": (0.1, 0.02)}, ["a"])])  # its replica span not in yet
    traced = traced_requests([replica, ingress, plain, lone_ingress])
    assert traced == {
        "x.0": Traced("b", pytest.approx(0.3), pytest.approx(0.05)),
        "x.1": Traced("a", None, None),
    }


def ok(ttft: float, tpot: float) -> Outcome:
    return Outcome(Arrival(0.0, "batch", 8, 8), "ok", ttft, tpot, 8)


def test_predictions_are_compared_per_replica_by_the_median_ratio():
    traced = {request_id("w", i): Traced("r1", 0.1, 0.02) for i in range(3)}
    traced[request_id("w", 3)] = Traced("r2", None, None)
    sent = [
        (request_id("w", 0), ok(0.2, 0.02)),  # ratios 0.5, 1.0
        (request_id("w", 1), ok(0.1, 0.04)),  # 1.0, 0.5
        (request_id("w", 2), ok(0.05, 0.01)),  # 2.0, 2.0
        (request_id("w", 3), ok(0.3, 0.03)),
        (request_id("w", 4), Outcome(Arrival(0.0, "batch", 8, 8), "refused")),  # not traced, not counted
        (request_id("w", 5), ok(0.3, 0.03)),  # completed, but its trace never arrived
    ]
    table = predicted_vs_realised(sent, traced, {"r1": "drafter x8", "r2": "drafter x2"})
    assert table == {
        "drafter x8 r1": {
            "requests": 3,
            "realised_ttft_p50_ms": 100.0,
            "realised_tpot_p50_ms": 20.0,
            "predicted_ttft_p50_ms": 100.0,
            "predicted_tpot_p50_ms": 20.0,
            "ttft_ratio_p50": 1.0,
            "tpot_ratio_p50": 1.0,
        },
        "drafter x2 r2": {
            "requests": 1,
            "realised_ttft_p50_ms": 300.0,
            "realised_tpot_p50_ms": 30.0,
            "predicted_ttft_p50_ms": None,
            "predicted_tpot_p50_ms": None,
            "ttft_ratio_p50": None,
            "tpot_ratio_p50": None,
        },
    }
    # Per class, with the targets: which class met its targets where (all "batch" here).
    loose, tight = SlaTarget("batch", 0.5, 1.0, 0.05), SlaTarget("interactive", 0.5, 1.0, 0.015)
    by_class = predicted_vs_realised(sent, traced, {}, [tight, loose])["? r1"]["by_class"]
    assert by_class == {
        "batch": {
            "requests": 3,
            "attainment": 1.0,
            "realised_tpot_p50_ms": 20.0,
            "realised_tpot_p99_ms": 39.6,
        }
    }
    tightened = predicted_vs_realised(sent, traced, {}, [SlaTarget("batch", 1.0, 1.0, 0.015)])
    assert tightened["? r1"]["by_class"]["batch"]["attainment"] == pytest.approx(1 / 3, abs=1e-4)
    # An optimistic router: half the realised TPOT predicted everywhere.
    slow = {rid: Traced("r1", 0.1, 0.01) for rid in traced}
    assert predicted_vs_realised(sent[:2], slow, {})["? r1"]["tpot_ratio_p50"] == pytest.approx(0.375)


def test_event_scores_round_trip_as_json():
    _, _, attrs = route_event({"a": (0.1234567, 0.0205)}, ["a"])
    assert json.loads(attrs[f"{ROUTE_EVENT}.scores"])["a"]["tpot_ms"] == 20.5
