"""deployments/thread_policy.py: which thread gets which policy (pure), and the kernel calls themselves in
a child process (a process's threads only; the policy is the kernel's, read back from it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from pydantic import ValidationError

from deployments.config import AppConfig
from deployments.thread_policy import SCHED_BATCH, SCHED_OTHER, cpu_split, plan

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread policy is Linux's")


def test_plan_puts_every_thread_but_the_engines_on_the_policy():
    assert plan("batch", [11, 12, 13], keep={12}) == {11: SCHED_BATCH, 12: SCHED_OTHER, 13: SCHED_BATCH}
    assert plan("normal", [11, 12], keep={12}) == {11: SCHED_OTHER, 12: SCHED_OTHER}
    assert plan("batch", []) == {}
    with pytest.raises(ValueError, match="serving_thread_policy: 'idle' is not one of"):
        plan("idle", [1])


def test_cpu_split_gives_the_engine_its_cpu_and_the_rest_to_serving():
    assert cpu_split(None, {0, 1, 2}) == ({0, 1, 2}, {0, 1, 2})
    assert cpu_split(2, {0, 1, 2}) == ({2}, {0, 1})
    with pytest.raises(ValueError, match=r"engine_cpu: CPU 5 is not one this process may use \(\[0, 1\]\)"):
        cpu_split(5, {0, 1})
    with pytest.raises(ValueError, match="engine_cpu: this process may use CPU 1 only; none is left"):
        cpu_split(1, {1})


def test_engine_cpu_needs_one_torch_thread(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert AppConfig(model=str(tmp_path), engine_cpu=1, torch_num_threads=1).engine_cpu == 1
    with pytest.raises(ValidationError, match="engine_cpu: pins the engine's one thread to one CPU"):
        AppConfig(model=str(tmp_path), engine_cpu=1)
    with pytest.raises(ValidationError, match="engine_cpu\n  Input should be greater than or equal to 0"):
        AppConfig(model=str(tmp_path), engine_cpu=-1, torch_num_threads=1)


def test_the_field_takes_normal_or_batch_only(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert AppConfig(model=str(tmp_path)).serving_thread_policy == "batch"
    assert AppConfig(model=str(tmp_path), serving_thread_policy="normal").serving_thread_policy == "normal"
    with pytest.raises(ValidationError, match="serving_thread_policy\n  Input should be 'normal' or 'batch'"):
        AppConfig(model=str(tmp_path), serving_thread_policy="idle")


# The child processes' common start: a thread parked until told, and its stop event.
STARTED = """
import json, os, threading
from deployments import thread_policy

def park(ready, done):
    ready.set()
    done.wait()

def started():
    ready, done = threading.Event(), threading.Event()
    thread = threading.Thread(target=park, args=(ready, done))
    thread.start()
    ready.wait()
    return thread, done
"""


def run_child(script: str) -> dict:
    """Run `script` in a fresh interpreter (its own threads, its own policies) and read what it printed."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout)


# A process with a started "engine" thread: everything else goes batch, the engine thread stays normal; a
# thread a batch thread starts afterwards is batch; an engine thread a batch thread starts (a rebuild) is
# put back to normal by the next apply, without privileges; the engine thread is named in /proc.
CHILD = """
engine, stop_engine = started()
other, stop_other = started()
first = thread_policy.apply("batch", keep={engine.native_id})
thread_policy.name_thread(engine.native_id, thread_policy.ENGINE_THREAD_NAME)
later, stop_later = started()  # started by the (batch) main thread
policy = os.sched_getscheduler
seen = {
    "applied": sorted(first.values()),
    "main": policy(threading.get_native_id()),
    "engine": policy(engine.native_id),
    "other": policy(other.native_id),
    "later": policy(later.native_id),
    "engine_name": open(f"/proc/self/task/{engine.native_id}/comm").read().strip(),
}
thread_policy.apply("batch", keep={later.native_id})  # "later" is the rebuilt engine's thread now
seen["rebuilt"], seen["old_engine"] = policy(later.native_id), policy(engine.native_id)
for done in (stop_engine, stop_other, stop_later):
    done.set()
print(json.dumps(seen))
"""


def test_the_kernel_applies_it_per_thread_and_back_without_privileges():
    seen = run_child(STARTED + CHILD)
    assert seen["applied"] == [SCHED_OTHER, SCHED_BATCH, SCHED_BATCH]  # main, engine, other
    assert (seen["main"], seen["engine"], seen["other"]) == (SCHED_BATCH, SCHED_OTHER, SCHED_BATCH)
    assert seen["later"] == SCHED_BATCH  # inherited from the thread that started it
    assert seen["engine_name"] == "dspark-engine"
    assert (seen["rebuilt"], seen["old_engine"]) == (SCHED_OTHER, SCHED_BATCH)


# engine_cpu: the engine thread on the last CPU, every other thread (started before or after) on the rest;
# reapplied after a "rebuild" from a serving thread, which sees the whole set again.
PINNED = """
cpus = sorted(os.sched_getaffinity(0))
engine, stop_engine = started()
thread_policy.apply("normal", keep={engine.native_id}, engine_cpu=cpus[-1])
later, stop_later = started()
affinity = lambda t: sorted(os.sched_getaffinity(t.native_id))
seen = {"cpus": cpus, "engine": affinity(engine), "later": affinity(later)}
seen["main"] = sorted(os.sched_getaffinity(0))
thread_policy.apply("batch", keep={later.native_id}, engine_cpu=cpus[-1])
seen["rebuilt"], seen["old_engine"] = affinity(later), affinity(engine)
seen["rebuilt_policy"] = os.sched_getscheduler(later.native_id)
for done in (stop_engine, stop_later):
    done.set()
print(json.dumps(seen))
"""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs a CPU to spare")
def test_engine_cpu_pins_the_engine_thread_alone():
    seen = run_child(STARTED + PINNED)
    engine_cpu, rest = seen["cpus"][-1:], seen["cpus"][:-1]
    assert (seen["engine"], seen["main"], seen["later"]) == (engine_cpu, rest, rest)
    assert (seen["rebuilt"], seen["old_engine"]) == (engine_cpu, rest)
    assert seen["rebuilt_policy"] == SCHED_OTHER


# An ingress (no engine thread) keeps off the engine's CPU; a CPU it may not use leaves it where it is.
INGRESS = """
import json, os
from deployments import thread_policy

cpus = sorted(os.sched_getaffinity(0))
thread_policy.apply("batch", engine_cpu=10_000)
seen = {"cpus": cpus, "elsewhere": sorted(os.sched_getaffinity(0))}
thread_policy.apply("batch", engine_cpu=cpus[-1])
seen["here"] = sorted(os.sched_getaffinity(0))
print(json.dumps(seen))
"""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs a CPU to spare")
def test_an_ingress_keeps_off_the_engine_cpu():
    seen = run_child(INGRESS)
    assert seen["elsewhere"] == seen["cpus"]
    assert seen["here"] == seen["cpus"][:-1]


def test_normal_touches_nothing():
    from deployments import thread_policy

    # What this process runs under is whatever earlier tests left (an in-process replica makes its
    # threads batch): "normal" must leave every thread's policy as it found it.
    def policies() -> dict[int, int]:
        seen = {}
        for tid in thread_policy.threads():
            try:
                seen[tid] = os.sched_getscheduler(tid)
            except ProcessLookupError:  # a thread (Ray's, from an earlier test) ended since the listing
                continue
        return seen

    before = policies()
    assert thread_policy.apply("normal", keep={1}) == {}
    after = policies()
    assert os.getpid() in before.keys() & after.keys()
    assert {tid: after[tid] for tid in before.keys() & after.keys()} == {
        tid: before[tid] for tid in before.keys() & after.keys()
    }
