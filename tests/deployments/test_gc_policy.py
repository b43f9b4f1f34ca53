"""serving_gc_threshold: the ingress process's youngest generation collected less often
(deployments/gc_policy.py). tests/deployments/test_gc_policy_serving.py reads it in a real ingress."""

from __future__ import annotations

import gc
import inspect
import os

import pydantic
import pytest

from deployments import gc_policy, thread_policy
from deployments.config import AppConfig


@pytest.fixture(autouse=True)
def python_collector():
    """Each test leaves the collector's thresholds as it found them (pytest's process runs on after)."""
    thresholds = gc.get_threshold()
    yield
    gc.set_threshold(*thresholds)


def test_young_collections_come_rarer_and_the_older_generations_keep_their_ratios():
    _, middle, oldest = gc.get_threshold()
    gc_policy.apply(10_000)
    assert gc.get_threshold() == (10_000, middle, oldest)


def test_none_leaves_pythons_collector_alone():
    before = gc.get_threshold(), gc.get_freeze_count()
    gc_policy.apply(None)
    assert (gc.get_threshold(), gc.get_freeze_count()) == before


def test_a_threshold_below_pythons_is_refused_naming_the_option():
    with pytest.raises(ValueError, match="serving_gc_threshold: 100 is below Python's own 700"):
        gc_policy.apply(100)
    assert AppConfig(model="m").serving_gc_threshold == 10_000
    with pytest.raises(pydantic.ValidationError, match="serving_gc_threshold"):
        AppConfig(model="m", serving_gc_threshold=100)
    assert AppConfig(model="m", serving_gc_threshold=None).serving_gc_threshold is None


def ingress_class():
    """Our Ingress class, under Serve's ASGI wrapper (whose async __init__ Serve awaits, then starts the
    app)."""
    from deployments.ingress import Ingress

    return next(
        c
        for c in Ingress.func_or_class.__mro__
        if c.__module__ == "deployments.ingress" and not inspect.iscoroutinefunction(c.__init__)
    )


def test_the_ingress_applies_it_as_it_starts_in_its_own_replica_process(qwen3_dir, monkeypatch):
    from tests.deployments.test_frontend import FakeReplica

    config = {"model": str(qwen3_dir), "stream_mux": False, "serving_gc_threshold": 5_000}
    before = gc.get_threshold(), gc.get_freeze_count()
    policies = {tid: os.sched_getscheduler(tid) for tid in thread_policy.threads()}
    ingress_class()(FakeReplica(), config)  # called directly: pytest's process is not the ingress's
    assert (gc.get_threshold(), gc.get_freeze_count()) == before
    # Nor are its threads changed (serving_thread_policy batch by default): those still there, as they were.
    after = {tid: os.sched_getscheduler(tid) for tid in thread_policy.threads() if tid in policies}
    assert after == {tid: policies[tid] for tid in after}
    # As a Serve replica (its context stood in for: a real one needs Serve to start it). "normal": the
    # ingress would otherwise put every thread of this process, pytest's, on SCHED_BATCH.
    monkeypatch.setattr("deployments.ingress.replica_context", lambda: object())
    ingress_class()(FakeReplica(), {**config, "serving_thread_policy": "normal"})
    assert gc.get_threshold()[0] == 5_000
