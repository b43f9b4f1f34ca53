"""How often Python's cyclic garbage collector runs in an ingress process, where the SLA router decides.

CPython collects its youngest generation once allocations outnumber deallocations by that generation's
threshold (700 by default), the middle one every tenth time, the whole heap every tenth of those. A
routing decision that reads a replica's new stats builds its speed and state, hundreds of objects, so at
1,000 replicas a collection runs every few decisions and counts in the decision it interrupts: in
bench/route_decision.py (stats new every 0.25 s) 1-2 % of decisions held one, each 1 to 145 ms longer,
and they set the decision's p99.

Serve already collects and freezes each replica's start-up heap once its constructor returns
(RAY_SERVE_FREEZE_GC_ON_STARTUP, on by default in Ray 2.60), so later collections skip the app, Serve,
Ray and the libraries, as vLLM's freeze_gc_heap and SGLang's freeze_gc do in their processes. What it
leaves as Python set it is how often young objects are collected (its proxies take
RAY_SERVE_PROXY_GC_THRESHOLD, its replicas nothing). Here the youngest generation waits for
`young_threshold` allocations. Most of a decision's objects are freed by reference counting long before
that, so collections are rarer and together cheaper, not merely postponed; the older generations keep
Python's ratios to it. Reference cycles, which the collector alone frees, live a little longer.
"""

from __future__ import annotations

import gc
import logging

log = logging.getLogger(__name__)

PYTHON_YOUNG_THRESHOLD = 700  # CPython's default gen0 threshold
SERVING_YOUNG_THRESHOLD = 10_000  # AppConfig.serving_gc_threshold's default


def apply(young_threshold: int | None) -> None:
    """Collect the youngest generation every `young_threshold` allocations; None leaves the collector as
    Python set it."""
    if young_threshold is None:
        return
    if young_threshold < PYTHON_YOUNG_THRESHOLD:
        raise ValueError(
            f"serving_gc_threshold: {young_threshold} is below Python's own {PYTHON_YOUNG_THRESHOLD}; "
            "it would collect more often, not less"
        )
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(young_threshold, middle, oldest)
    log.info("gc: thresholds %s", gc.get_threshold())
