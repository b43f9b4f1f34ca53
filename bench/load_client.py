"""The serving benches' load generator: the clients that stream each served arm's requests, and what
they cost the process they run in.

The offline arm is driven by one asyncio event loop in the bench's process (bench/serve.py's
`run_offline`). By default (`async`) the served arms are driven the same way, from that one loop: the
gRPC SDK's asyncio client (dspark_client.AsyncClient) and aiohttp for the OpenAI HTTP API (aiohttp comes
with ray[serve]). The `sync` clients are the blocking ones on a thread per concurrent request (the
`openai` client and dspark_client.Client), what the benches used before: on a 2-CPU host the sync gRPC
client's own threads woke 3.5-3.7 times and preempted the engine thread 1.2-1.8 times per token, so the
bench measured its own client with the server. Each request is timed alike in both: from just before
the call to its first message (TTFT) and to its end, tokens from the usage the server reports.

`client_cost` reads what the load generator spent (CPU, wake-ups, preemptions) from the kernel's
counters of the whole process (threads that already ended included) less the offline engine's thread.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

CLIENTS = ("async", "sync")


@dataclass
class Sample:
    tokens: int
    seconds: float  # request start to last token
    ttft: float
    messages: int = 0  # stream messages received (SSE chunks with text, gRPC deltas)


class Clock:
    """One request's timing: started when made, first message, messages counted."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.first: float | None = None
        self.messages = 0

    def message(self, counted: bool = True) -> None:
        self.first = self.first or time.perf_counter()
        self.messages += counted

    def sample(self, tokens: int) -> Sample:
        if self.first is None:
            raise RuntimeError("the stream ended without a message")
        return Sample(tokens, time.perf_counter() - self.start, self.first - self.start, self.messages)


def completion_body(model: str, prompt: str, max_tokens: int) -> dict:
    """The streamed, greedy, fixed-length completion request, as the sync `openai` client sends it."""
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }


def sse_chunk(line: bytes) -> dict | None:
    """The JSON chunk one line of an OpenAI server-sent event stream carries; None for any other line
    (blank separators, comments, `data: [DONE]`); an error event raises."""
    if not line.startswith(b"data:"):
        return None
    data = line[5:].strip()
    if data == b"[DONE]":
        return None
    chunk = json.loads(data)
    if "error" in chunk:
        raise RuntimeError(f"stream error: {chunk['error']}")
    return chunk


# The sync clients: one thread per concurrent request.


def run_threads(
    fn: Callable[[str], Sample], prompts: list[str], concurrency: int
) -> tuple[list[Sample], float]:
    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        samples = list(pool.map(fn, prompts))
    return samples, time.perf_counter() - start


def http_request(client, model: str, max_tokens: int) -> Callable[[str], Sample]:
    """One streamed completion through the blocking `openai` client."""

    def one(prompt: str) -> Sample:
        clock, tokens = Clock(), 0
        stream = client.completions.create(
            model=model,
            prompt=prompt,
            max_tokens=max_tokens,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        for chunk in stream:
            clock.message(bool(chunk.choices))
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
        return clock.sample(tokens)

    return one


def grpc_request(client, max_tokens: int) -> Callable[[str], Sample]:
    """One Generate stream through the blocking dspark_client.Client."""

    def one(prompt: str) -> Sample:
        clock = Clock()
        with client.stream(prompt, max_tokens=max_tokens, temperature=0.0, ignore_eos=True) as stream:
            for _ in stream:
                clock.message()
        return clock.sample(stream.completion.usage.completion_tokens)

    return one


# The async clients: every request a task on one event loop.


async def gather(
    fn: Callable[[str], Awaitable[Sample]], prompts: list[str], concurrency: int
) -> tuple[list[Sample], float]:
    """`fn` over `prompts`, at most `concurrency` at a time, results in the prompts' order."""
    gate = asyncio.Semaphore(concurrency)

    async def gated(prompt: str) -> Sample:
        async with gate:
            return await fn(prompt)

    start = time.perf_counter()
    samples = list(await asyncio.gather(*(gated(p) for p in prompts)))
    return samples, time.perf_counter() - start


def http_request_async(
    session, base_url: str, model: str, max_tokens: int
) -> Callable[[str], Awaitable[Sample]]:
    """One streamed completion through an aiohttp.ClientSession, its SSE read line by line."""
    url = base_url + "/v1/completions"

    async def one(prompt: str) -> Sample:
        clock, tokens = Clock(), 0
        async with session.post(url, json=completion_body(model, prompt, max_tokens)) as response:
            if response.status != 200:
                raise RuntimeError(f"HTTP {response.status}: {await response.text()}")
            async for line in response.content:
                chunk = sse_chunk(line)
                if chunk is None:
                    continue
                clock.message(bool(chunk["choices"]))
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
        return clock.sample(tokens)

    return one


def grpc_request_async(client, max_tokens: int) -> Callable[[str], Awaitable[Sample]]:
    """One Generate stream through dspark_client.AsyncClient."""

    async def one(prompt: str) -> Sample:
        clock = Clock()
        async with client.stream(prompt, max_tokens=max_tokens, temperature=0.0, ignore_eos=True) as stream:
            async for _ in stream:
                clock.message()
        return clock.sample(stream.completion.usage.completion_tokens)

    return one


class LoadGen:
    """The served arms' clients of one kind (CLIENTS), by surface ("http", "grpc"); the async ones live
    on `loop`, the loop the offline arm runs on too. `run(surface, prompts, concurrency)` streams them."""

    def __init__(
        self,
        kind: str,
        loop: asyncio.AbstractEventLoop,
        http_url: str,
        grpc_target: str,
        model_name: str,
        max_tokens: int,
    ):
        import dspark_client

        if kind not in CLIENTS:
            raise ValueError(f"client must be one of {CLIENTS}, not {kind!r}")
        self.kind, self.loop = kind, loop
        if kind == "sync":
            import openai

            http = openai.OpenAI(base_url=http_url + "/v1", api_key="-", max_retries=0, timeout=600)
            self._grpc = dspark_client.Client(grpc_target, timeout_s=600)
            self.requests = {
                "http": http_request(http, model_name, max_tokens),
                "grpc": grpc_request(self._grpc, max_tokens),
            }
            return

        async def open_clients():  # both bind to the running loop
            import aiohttp

            session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600))
            return session, dspark_client.AsyncClient(grpc_target, timeout_s=600)

        self._session, self._grpc = loop.run_until_complete(open_clients())
        self.requests = {
            "http": http_request_async(self._session, http_url, model_name, max_tokens),
            "grpc": grpc_request_async(self._grpc, max_tokens),
        }

    def run(self, surface: str, prompts: list[str], concurrency: int) -> tuple[list[Sample], float]:
        fn = self.requests[surface]
        if self.kind == "sync":
            return run_threads(fn, prompts, concurrency)
        return self.loop.run_until_complete(gather(fn, prompts, concurrency))

    def close(self) -> None:
        if self.kind == "sync":
            self._grpc.close()
            return
        self.loop.run_until_complete(self._session.close())
        self.loop.run_until_complete(self._grpc.close())


# What the load generator costs its process.


@dataclass(frozen=True)
class Cost:
    cpu_s: float
    wakeups: int  # voluntary context switches: the thread slept and was woken
    preemptions: int  # involuntary ones

    def __add__(self, other: Cost) -> Cost:
        return Cost(
            self.cpu_s + other.cpu_s, self.wakeups + other.wakeups, self.preemptions + other.preemptions
        )

    def __sub__(self, other: Cost) -> Cost:
        return Cost(
            self.cpu_s - other.cpu_s, self.wakeups - other.wakeups, self.preemptions - other.preemptions
        )

    def per_token(self, tokens: int) -> dict[str, float]:
        return {
            "client_cpu_us_per_token": 1e6 * self.cpu_s / tokens,
            "client_wakeups_per_token": self.wakeups / tokens,
            "client_preempted_per_token": self.preemptions / tokens,
        }


def thread_cost(tid: int) -> Cost:
    """One thread of this process so far: CPU from schedstat, its switches from status."""
    task = Path(f"/proc/self/task/{tid}")
    switches = dict.fromkeys(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"), 0)
    for line in (task / "status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in switches:
            switches[key] = int(value)
    on_cpu_ns = int((task / "schedstat").read_text().split()[0])
    return Cost(on_cpu_ns / 1e9, *switches.values())


def thread_costs(skip_tid: int) -> dict[str, Cost]:
    """This process' live threads but `skip_tid` so far, summed by thread name ("main" for the main
    thread; Python's other threads carry the process' name, gRPC's and Ray's C++ threads their own)."""
    by_name: dict[str, Cost] = {}
    for task in Path("/proc/self/task").iterdir():
        tid = int(task.name)
        if tid == skip_tid:
            continue
        try:
            name = "main" if tid == os.getpid() else (task / "comm").read_text().strip()
            cost = thread_cost(tid)
        except (OSError, ValueError):  # ended meanwhile
            continue
        by_name[name] = by_name.get(name, Cost(0.0, 0, 0)) + cost
    return by_name


def by_thread(before: dict[str, Cost], after: dict[str, Cost], total: Cost, tokens: int) -> dict[str, list]:
    """Per thread name, [CPU µs, wake-ups, preemptions] per token between two `thread_costs` readings;
    "(ended)": what threads that ended meanwhile spent (`total`, the `client_cost` difference, less the
    live threads'). Names that spent nothing are left out."""
    zero = Cost(0.0, 0, 0)
    spent = {name: cost - before.get(name, zero) for name, cost in after.items()}
    live = sum(spent.values(), zero)
    spent["(ended)"] = total - live
    return {
        name: [
            round(1e6 * c.cpu_s / tokens, 1),
            round(c.wakeups / tokens, 3),
            round(c.preemptions / tokens, 3),
        ]
        for name, c in sorted(spent.items(), key=lambda kv: -kv[1].cpu_s)
        if c.wakeups > 0 or c.cpu_s > 0
    }


def client_cost(skip_tid: int) -> Cost:
    """This whole process so far (getrusage counts its ended threads too: a sync run's pool threads),
    less the thread `skip_tid` (the offline engine's, idle during a served arm)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    whole = Cost(usage.ru_utime + usage.ru_stime, usage.ru_nvcsw, usage.ru_nivcsw)
    return whole - thread_cost(skip_tid)
