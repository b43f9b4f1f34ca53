"""serving_gc_threshold: the ingress process's collector, frozen after start-up and its youngest generation
collected less often (deployments/gc_policy.py)."""

from __future__ import annotations

import gc
import inspect
import weakref

import pydantic
import pytest

from deployments import gc_policy
from deployments.config import AppConfig


@pytest.fixture(autouse=True)
def python_collector():
    """Each test leaves the collector as it found it (pytest's process runs on after)."""
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


class Node:
    def __init__(self) -> None:
        self.other = self  # a reference cycle: only the collector frees it


def test_start_up_garbage_is_collected_then_the_heap_frozen_and_young_collections_come_rarer():
    _, middle, oldest = gc.get_threshold()
    garbage = Node()
    gone = weakref.ref(garbage)
    del garbage
    kept = Node()  # alive at start-up: frozen out of later collections
    gc_policy.apply(10_000)
    assert gone() is None  # collected before the freeze, not frozen for good
    assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == (10_000, middle, oldest)
    assert kept.other is kept


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


def test_the_ingress_applies_it_as_it_starts(qwen3_dir):
    from deployments.ingress import Ingress
    from tests.deployments.test_frontend import FakeReplica

    # Our class under Serve's ASGI wrapper (whose async __init__ Serve awaits, then starts the app).
    ours = next(
        c
        for c in Ingress.func_or_class.__mro__
        if c.__module__ == "deployments.ingress" and not inspect.iscoroutinefunction(c.__init__)
    )
    # "normal": the ingress would otherwise put every thread of this process (pytest's) on SCHED_BATCH.
    config = {
        "model": str(qwen3_dir),
        "stream_mux": False,
        "serving_thread_policy": "normal",
        "serving_gc_threshold": 5_000,
    }
    ours(FakeReplica(), config)
    assert gc.get_threshold()[0] == 5_000 and gc.get_freeze_count() > 0
