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

`engine_cpu` goes further where the host has a CPU to spare for it: the engine thread runs on that CPU
only and every serving thread (the replica's others, the ingress') on the other CPUs the process may use,
so no serving thread ever runs on the engine's CPU, its caches stay the engine's (affinity is per thread
too, inherited by the threads started later, and needs no privilege for threads of the same user). It
only keeps our own threads apart: other processes still run anywhere, and the engine can no longer move
to a free CPU when its own is taken.
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


def cpu_split(engine_cpu: int | None, allowed: Collection[int]) -> tuple[set[int], set[int]]:
    """(the engine thread's CPUs, the serving threads' CPUs) out of the CPUs the process may use: with
    `engine_cpu`, that one CPU and the others; without, all of them for both."""
    allowed = set(allowed)
    if engine_cpu is None:
        return allowed, allowed
    if engine_cpu not in allowed:
        raise ValueError(f"engine_cpu: CPU {engine_cpu} is not one this process may use ({sorted(allowed)})")
    if len(allowed) < 2:
        raise ValueError(f"engine_cpu: this process may use CPU {engine_cpu} only; none is left to serve on")
    return {engine_cpu}, allowed - {engine_cpu}


def threads(pid: int | str = "self") -> list[int]:
    """The thread ids of a process (this one by default), from /proc."""
    return sorted(int(tid) for tid in os.listdir(f"/proc/{pid}/task"))


def apply(policy: str, keep: Collection[int] = (), engine_cpu: int | None = None) -> dict[int, int]:
    """Give this process's threads `policy`, those in `keep` (the engine's) normal, and with `engine_cpu`
    put those in `keep` on that CPU and the others on the rest (`cpu_split`); returns the policy each
    thread got. "normal" changes no policy (no thread was ever made batch otherwise). A thread that exits
    meanwhile is skipped; a host without per-thread policy (not Linux) changes nothing."""
    if policy == "normal" and engine_cpu is None:
        return {}
    if not hasattr(os, "sched_setscheduler") or not os.path.isdir("/proc/self/task"):
        log.warning("serving_thread_policy / engine_cpu: this platform has no per-thread scheduling")
        return {}
    tids = threads()
    allowed = _allowed(tids) if engine_cpu is not None else set()
    if not keep and engine_cpu is not None and allowed - {engine_cpu} in (set(), allowed):
        # No engine here (an ingress): nothing to keep off when the engine's CPU is not one this process
        # may use (another node, another cpuset), nowhere to go when it is the only one.
        engine_cpu = None
    engine_cpus, serving_cpus = cpu_split(engine_cpu, allowed)
    applied = {}
    for tid, number in plan(policy, tids, keep).items():
        try:
            if policy != "normal":
                os.sched_setscheduler(tid, number, os.sched_param(0))
            if engine_cpu is not None:
                os.sched_setaffinity(tid, engine_cpus if tid in keep else serving_cpus)
        except ProcessLookupError:  # the thread ended since the listing
            continue
        applied[tid] = number
    return applied


def _allowed(tids: Iterable[int]) -> set[int]:
    """The CPUs this process may use: those of all its threads together (once split, no one thread has
    them all; reapplying after an engine rebuild must see the same set)."""
    cpus: set[int] = set()
    for tid in tids:
        try:
            cpus |= os.sched_getaffinity(tid)
        except ProcessLookupError:
            continue
    return cpus


def name_thread(tid: int, name: str) -> None:
    """Name one of this process's threads in /proc (15 bytes at most): Python's thread names stay in
    Python, so without this every thread shows the process title."""
    try:
        with open(f"/proc/self/task/{tid}/comm", "w") as comm:
            comm.write(name[:15])
    except OSError:  # not Linux, or the thread has ended
        pass
