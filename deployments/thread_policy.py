"""The scheduling policy of a serving process's threads, so that the engine thread keeps its CPU.

Each streamed token wakes the target replica's event loop, the ingress and the client once. Linux's fair
scheduler lets a thread that wakes up preempt the one running on its CPU when it is owed CPU time, and on a
host of few cores that CPU is often the engine's: its step then stretches by the intruder's run and by
the cache it evicts. SCHED_BATCH (sched(7)) marks a thread as not latency-sensitive: it keeps its fair
share of CPU, but a batch thread that wakes never preempts the running one; it runs on a free CPU, or
when the running thread's slice ends. The serving threads lose nothing of their throughput that way, only
the right to cut into a step, and a token reaches the client at most a slice later.

Without privileges a thread may switch any thread of its user between SCHED_OTHER and SCHED_BATCH, at an
unchanged nice (sched_setscheduler(2), Linux 2.6.39 on), in either direction, so the order is free: the
replica puts its every thread on batch and its engine thread back on normal, also after rebuilding the
engine from a (batch) worker thread. A thread created later inherits its creator's policy, so Ray's and
Serve's threads started afterwards are batch and the engine thread's own helpers normal. Nice is not used:
raising it is one-way without CAP_SYS_NICE, so an engine thread started from a niced thread could never
get its priority back.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Collection, Iterable

log = logging.getLogger(__name__)

# AppConfig.serving_thread_policy's values: Linux's policy numbers (sched.h), fixed by the kernel's ABI.
SCHED_OTHER, SCHED_BATCH = 0, 3
POLICIES = {"normal": SCHED_OTHER, "batch": SCHED_BATCH}
ENGINE_THREAD_NAME = "dspark-engine"  # the engine thread's name in /proc (ps -L, top -H, profilers)


def plan(policy: str, threads: Iterable[int], keep: Collection[int] = ()) -> dict[int, int]:
    """The policy number each thread gets: `policy` for every thread but those in `keep` (the engine's),
    which run normal."""
    if policy not in POLICIES:
        raise ValueError(f"serving_thread_policy: {policy!r} is not one of {sorted(POLICIES)}")
    return {tid: SCHED_OTHER if tid in keep else POLICIES[policy] for tid in threads}


def threads(pid: int | str = "self") -> list[int]:
    """The thread ids of a process (this one by default), from /proc."""
    return sorted(int(tid) for tid in os.listdir(f"/proc/{pid}/task"))


def apply(policy: str, keep: Collection[int] = ()) -> dict[int, int]:
    """Give this process's threads `policy`, those in `keep` normal; returns what each thread got.
    "normal" leaves every thread as it is (nothing to undo: no thread was ever made batch otherwise).
    A thread that exits meanwhile is skipped; a host without SCHED_BATCH (not Linux) changes nothing."""
    if policy == "normal":
        return {}
    if not hasattr(os, "sched_setscheduler") or not os.path.isdir("/proc/self/task"):
        log.warning("serving_thread_policy %s: this platform has no per-thread policy; left as is", policy)
        return {}
    applied = {}
    for tid, number in plan(policy, threads(), keep).items():
        try:
            os.sched_setscheduler(tid, number, os.sched_param(0))
        except ProcessLookupError:  # the thread ended since the listing
            continue
        applied[tid] = number
    return applied


def name_thread(tid: int, name: str) -> None:
    """Name one of this process's threads in /proc (15 bytes at most): Python's thread names stay in
    Python, so without this every thread shows the process title."""
    try:
        with open(f"/proc/self/task/{tid}/comm", "w") as comm:
            comm.write(name[:15])
    except OSError:  # not Linux, or the thread has ended
        pass
