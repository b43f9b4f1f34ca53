"""The ingress' own admission (deployments/ingress_admission.py): the bound, the slots, the retry hint."""

from __future__ import annotations

import pytest

from deployments.ingress_admission import DRAIN_WINDOW_S, MAX_RETRY_S, MIN_RETRY_S, IngressAdmission
from dspark.errors import AdmissionError


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_refuses_past_running_plus_queued_and_names_the_cause():
    admission = IngressAdmission(running=2, queued=1, clock=Clock())
    slots = [admission.enter() for _ in range(3)]
    with pytest.raises(AdmissionError) as err:
        admission.enter()
    assert err.value.reason.startswith("ingress full: 3 requests in flight")
    assert "limit 3: 2 running + 1 queued" in err.value.reason
    assert err.value.retry_after_s == MIN_RETRY_S  # nothing finished yet: no rate to go by
    slots[0].release()
    slots[0].release()  # idempotent: the stream's end and its collection both release
    assert admission.in_flight == 2
    admission.enter()
    assert admission.in_flight == 3


def test_unbounded_when_queued_is_none():
    admission = IngressAdmission(running=1, queued=None, clock=Clock())
    for _ in range(50):
        admission.enter()
    assert admission.in_flight == 50 and admission.limit is None


def test_retry_hint_is_the_queue_ahead_over_the_drain_rate():
    clock = Clock()
    admission = IngressAdmission(running=2, queued=4, clock=clock)
    clock.now += DRAIN_WINDOW_S
    for _ in range(5):  # 5 finished in the last 10 s: 0.5 requests/s
        admission.enter().release()
    for _ in range(6):
        admission.enter()
    assert admission.drain_rate() == pytest.approx(0.5)
    with pytest.raises(AdmissionError) as err:
        admission.enter()
    assert err.value.retry_after_s == 8.0  # 4 queued ahead at 0.5/s
    clock.now += DRAIN_WINDOW_S + 1  # the rate's readings age out: back to the floor
    assert admission.drain_rate() is None and admission.retry_after_s() == MIN_RETRY_S


def test_retry_hint_is_bounded():
    clock = Clock()
    admission = IngressAdmission(running=1, queued=100, clock=clock)
    clock.now += DRAIN_WINDOW_S
    admission.enter().release()  # 0.1 requests/s; 100 queued ahead: 1000 s
    for _ in range(101):
        admission.enter()
    assert admission.retry_after_s() == MAX_RETRY_S
    fast = IngressAdmission(running=1, queued=1, clock=clock)
    clock.now += 1.0
    for _ in range(100):
        fast.enter().release()
    assert fast.retry_after_s() == MIN_RETRY_S
