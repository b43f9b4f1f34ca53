"""serving_thread_policy and engine_cpu through real Ray Serve: with "batch", every thread of the target
replica but its engine thread, and every thread of the ingress replica, runs SCHED_BATCH (read back from
the kernel), the engine thread runs normal; with engine_cpu the engine thread runs on that CPU alone and
every other thread of both on the others; greedy output stays identical to the offline engine. The
shared app runs the defaults: batch, no pinning."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import openai
import pytest
from ray import serve
from serving import APP, ENGINE, app_args

from bench.serve import own_processes
from deployments.app import build_app
from deployments.thread_policy import ENGINE_THREAD_NAME, SCHED_BATCH, SCHED_OTHER
from dspark import LLM, SamplingParams

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread policy is Linux's")
BATCHED = "batched"
PROMPT = "def wrap(text, width):"
CPUS = sorted(os.sched_getaffinity(0))
ENGINE_CPU = CPUS[-1] if len(CPUS) > 1 else None  # where there is a CPU to spare


def replica_processes(app: str, deployment: str) -> list[int]:
    """The pids of the replica processes of `app`'s `deployment` that descend from this process (Ray
    started here; another Ray on the machine is not ours)."""
    title = f"ray::ServeReplica:{app}:{deployment}"
    return [pid for pid, cmdline in own_processes().items() if cmdline.startswith(title)]


def by_thread_name(pid: int, read=os.sched_getscheduler) -> dict[str, list]:
    """`read(tid)` for each thread of a process (its scheduling policy by default), by the thread's name
    in /proc."""
    found: dict[str, list] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found.setdefault((task / "comm").read_text().strip(), []).append(read(int(task.name)))
        except OSError:  # the thread ended meanwhile
            continue
    return found


def values(*by_name: dict[str, list]) -> list:
    return [value for found in by_name for each in found.values() for value in each]


def cpus(tid: int) -> list[int]:
    return sorted(os.sched_getaffinity(tid))


@pytest.fixture(scope="module")
def batched(serve_stack):
    args = app_args(
        serve_stack.model_dir, num_replicas=1, serving_thread_policy="batch", engine_cpu=ENGINE_CPU
    )
    serve.run(build_app(args), name=BATCHED, route_prefix="/batched")
    yield serve_stack
    serve.delete(BATCHED)


def test_serving_threads_run_batch_and_the_engine_thread_normal(batched):
    client = openai.OpenAI(base_url=batched.http_url + "/batched/v1", api_key="-", max_retries=0, timeout=60)
    chunks = list(
        client.completions.create(
            model=batched.model_name,
            prompt=PROMPT,
            max_tokens=40,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
    )
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    expected = LLM(str(batched.model_dir), **ENGINE).generate([PROMPT], params)[0]
    assert "".join(c.choices[0].text for c in chunks if c.choices) == expected.text
    assert chunks[-1].usage.completion_tokens == 40

    # After the stream: the threads Serve and Ray started for it (the socket's, thread pools) count too.
    (replica_pid,) = replica_processes(BATCHED, "TargetReplica")
    (ingress_pid,) = replica_processes(BATCHED, "Ingress")
    replica = by_thread_name(replica_pid)
    assert replica.pop(ENGINE_THREAD_NAME) == [SCHED_OTHER]
    assert len(values(replica)) > 5 and set(values(replica)) == {SCHED_BATCH}
    ingress = values(by_thread_name(ingress_pid))
    assert len(ingress) > 5 and set(ingress) == {SCHED_BATCH}
    if ENGINE_CPU is None:
        return
    rest = [cpu for cpu in CPUS if cpu != ENGINE_CPU]
    replica_cpus = by_thread_name(replica_pid, cpus)
    assert replica_cpus.pop(ENGINE_THREAD_NAME) == [[ENGINE_CPU]]
    others = values(replica_cpus, by_thread_name(ingress_pid, cpus))
    assert len(others) > 10 and all(each == rest for each in others)


def test_the_defaults_run_the_serving_threads_batch_unpinned(serve_stack):
    replicas = replica_processes(APP, "TargetReplica")
    assert len(replicas) == 2
    processes = replicas + replica_processes(APP, "Ingress")
    engine_threads = [by_thread_name(pid).pop(ENGINE_THREAD_NAME) for pid in replicas]
    assert engine_threads == [[SCHED_OTHER], [SCHED_OTHER]]
    policies = values(*map(by_thread_name, processes))
    assert policies.count(SCHED_OTHER) == 2 and set(policies) == {SCHED_OTHER, SCHED_BATCH}
    assert all(each == CPUS for each in values(*(by_thread_name(pid, cpus) for pid in processes)))
