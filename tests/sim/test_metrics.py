"""sim/metrics.py on hand-built requests: attainment overall and by half of the scored window."""

import pytest

from router.policy import Sla
from sim.metrics import summarize, ttft_split
from sim.workload import Request

CLASSES = {"interactive": Sla("interactive", 1.0, 0.025, 0, True)}


def request(rid: int, arrival: float, ttft: float, tpot: float, outcome: str = "done") -> Request:
    req = Request(rid, arrival, 100, 11, "interactive", "chat")
    req.first_token, req.generated, req.outcome = arrival + ttft, 11, outcome
    req.finish = req.first_token + 10 * tpot
    return req


def test_attainment_by_half_shows_a_queue_that_grows():
    # Window 2 s .. 10 s (middle 6 s). First half: 3 of 4 attain (one TPOT miss). Second half: 1 of 4
    # (a TTFT miss, a shed request, a TPOT miss). Arrivals before the warm-up or after the window do
    # not count.
    reqs = [
        request(0, 1.0, 5.0, 0.1),  # warm-up
        request(1, 2.0, 0.1, 0.02),
        request(2, 3.0, 0.1, 0.02),
        request(3, 4.0, 0.1, 0.03),
        request(4, 5.9, 0.1, 0.02),
        request(5, 6.0, 0.1, 0.02),
        request(6, 7.0, 1.5, 0.02),
        request(7, 8.0, 0.0, 0.0, outcome="shed"),
        request(8, 9.9, 0.1, 0.026),
        request(9, 10.0, 0.1, 0.02),  # after the window
    ]
    out = summarize(reqs, CLASSES, warmup_s=2.0, duration_s=10.0)
    assert out["requests"] == 8 and out["shed"] == 1
    assert out["attainment"] == 0.5
    assert out["attainment_halves"] == [0.75, 0.25]


def test_an_empty_half_has_no_attainment():
    out = summarize([request(1, 2.5, 0.1, 0.02)], CLASSES, warmup_s=2.0, duration_s=10.0)
    assert out["attainment_halves"] == [1.0, None]


def test_ttft_split_summarises_each_part_of_the_scored_finished_requests():
    reqs = [request(i, 2.0 + i, 0.1 * (i + 1), 0.02) for i in range(4)]
    for i, r in enumerate(reqs):  # path 10 ms + i ms, queue i x 10 ms, prefill the rest
        r.admitted = r.arrival + 0.01 + 0.001 * i
        r.scheduled = r.admitted + 0.01 * i
    reqs.append(request(9, 1.0, 0.1, 0.02))  # warm-up: not scored
    reqs[-1].admitted, reqs[-1].scheduled = 1.05, 1.06
    reqs.append(request(10, 3.5, 0.1, 0.02))  # no parts (a real request without timing): left out
    split = ttft_split(reqs, 2.0, 10.0)
    assert split["requests"] == 4
    assert split["path_s"]["mean"] == 0.0115 and split["queue_s"]["mean"] == 0.015
    assert split["prefill_s"]["p50"] == 0.2235 and split["queue_s"]["p99"] == 0.0297
    assert ttft_split([], 2.0, 10.0)["path_s"] == {"mean": None, "p50": None, "p99": None}


def test_ttft_split_gives_the_way_in_and_puts_the_way_back_in_the_path():
    req = request(1, 2.0, 0.1, 0.02)
    req.admitted, req.scheduled, req.path_back = 2.012, 2.02, 0.005
    split = ttft_split([req], 2.0, 10.0)
    assert split["inbound_s"]["mean"] == pytest.approx(0.012, abs=1e-12)
    assert split["path_s"]["mean"] == pytest.approx(0.017, abs=1e-12)
    assert split["prefill_s"]["mean"] == pytest.approx(0.1 - 0.02 - 0.005, abs=1e-12)
