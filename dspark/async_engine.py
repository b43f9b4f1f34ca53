"""AsyncEngine: the engine on a background thread, with asyncio streams of deltas per request.

The step loop owns the engine; callers talk to it through an inbox drained between steps, so no lock
is held across a forward and the event loop never blocks on the model. Calls into the engine thread
resolve futures (`submit`), so a caller waits with a deadline and a stuck engine holds no thread.

A step that raises for no one request (the batched forward itself) leaves the engine's state suspect:
every request in flight fails with EngineDeadError and the engine reports itself unhealthy, so that
Serve replaces it. Failures of one request's own work never get here (Engine._isolated).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
import time
import uuid
from collections.abc import AsyncIterator
from collections.abc import Sequence as Seq

from dspark.config import EngineConfig
from dspark.engine import Engine
from dspark.errors import EngineDeadError
from dspark.outputs import RequestOutput
from dspark.sampling_params import SamplingParams

log = logging.getLogger(__name__)
CALL_TIMEOUT_S = 5.0  # how long a call into the engine thread may wait for the step in progress


class AsyncEngine:
    def __init__(self, config: EngineConfig | None = None, engine: Engine | None = None) -> None:
        if engine is None and config is None:
            raise ValueError("pass an EngineConfig or an Engine")
        self.engine = engine or Engine(config)
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._wake = threading.Event()
        self._stopped = False
        self.last_progress = time.monotonic()  # the health check reads this
        self._thread = threading.Thread(target=self._loop, name="dspark-engine", daemon=True)
        self._thread.start()

    @property
    def stats(self):
        return self.engine.stats

    @property
    def thread_id(self) -> int | None:
        """The engine thread's OS thread id (what per-thread scheduler settings and /proc name)."""
        return self._thread.native_id

    def health_problem(self, stuck_after_s: float = 30.0) -> str | None:
        """Why this engine should be replaced, or None while it is healthy."""
        if self._stopped:
            return "engine loop dead: shut down"
        if not self._thread.is_alive():
            return "engine loop dead: its thread exited"
        if self.engine.unhealthy is not None:
            return self.engine.unhealthy
        idle = time.monotonic() - self.last_progress
        if self.engine.has_unfinished() and idle >= stuck_after_s:
            return f"engine loop stuck: no step finished for {idle:.0f}s with requests running"
        return None

    def is_healthy(self, stuck_after_s: float = 30.0) -> bool:
        return self.health_problem(stuck_after_s) is None

    async def generate(
        self, prompt: str | Seq[int], params: SamplingParams | None = None, request_id: str | None = None
    ) -> AsyncIterator[RequestOutput]:
        """Stream one request's outputs (each carries its delta); abandoning the stream aborts it."""
        request_id = request_id or uuid.uuid4().hex
        stream: asyncio.Queue = asyncio.Queue()
        await self.open(prompt, params, request_id, stream)
        finished = False
        try:
            while True:
                item = await stream.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.finished:
                    finished = True
                    return
        finally:
            if not finished:
                self.abort(request_id)

    async def open(
        self, prompt: str | Seq[int], params: SamplingParams | None, request_id: str, outputs: asyncio.Queue
    ) -> None:
        """Admit a request whose outputs the engine thread puts into `outputs`, on the caller's event
        loop: each RequestOutput up to the finished one, or the exception that ended the request. Raises
        InvalidRequestError / AdmissionError exactly as Engine.add_request does. A caller that stops
        reading before the finished output must `abort(request_id)`.

        What `generate` is built on, for a caller that reads the queue itself (the serving replica):
        one queue between the engine thread and the reader, no task in between."""
        self._check_alive()
        loop = asyncio.get_running_loop()
        admitted: asyncio.Future = loop.create_future()
        self._call("add", (prompt, params, request_id, loop, outputs, admitted))
        try:
            await admitted
        except asyncio.CancelledError:  # the caller left meanwhile: the request, if admitted, must not run
            self.abort(request_id)
            raise

    def abort(self, request_id: str) -> None:
        self._call("abort", request_id)

    def submit(self, fn, *args) -> concurrent.futures.Future:
        """Queue fn(engine, *args) for the engine thread, which runs it between steps (admin: budgets,
        state); the future resolves there. Cancelling it before it runs drops the call."""
        self._check_alive()
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._call("call", (fn, args, future))
        return future

    def call(self, fn, *args, timeout_s: float = CALL_TIMEOUT_S):
        """submit() and wait: EngineDeadError at once when the loop is gone, TimeoutError when the
        step in progress does not end within `timeout_s` (the call is then dropped)."""
        future = self.submit(fn, *args)
        try:
            return future.result(timeout_s)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"the engine did not answer within {timeout_s:g}s (a step is stuck)") from None

    async def call_async(self, fn, *args, timeout_s: float = CALL_TIMEOUT_S):
        """call() for coroutines: waits on the event loop, so a stuck engine costs no thread."""
        future = asyncio.wrap_future(self.submit(fn, *args))
        try:
            return await asyncio.wait_for(future, timeout_s)  # cancels the call on timeout
        except asyncio.TimeoutError:
            raise TimeoutError(f"the engine did not answer within {timeout_s:g}s (a step is stuck)") from None

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Stop the loop; every request still running is failed explicitly with EngineDeadError."""
        self._stopped = True
        self._wake.set()
        self._thread.join(timeout_s)

    # ---- engine thread ----------------------------------------------------------------------------

    def _check_alive(self) -> None:
        if self._stopped or not self._thread.is_alive():
            raise EngineDeadError("engine is shut down")

    def _call(self, kind: str, payload) -> None:
        self._inbox.put((kind, payload))
        self._wake.set()

    def _drain_inbox(self) -> None:
        while True:
            try:
                kind, payload = self._inbox.get_nowait()
            except queue.Empty:
                return
            if kind == "add":
                prompt, params, request_id, loop, stream, admitted = payload
                try:
                    self.engine.add_request(prompt, params, request_id)
                except Exception as exc:  # refused: tell the caller, leave the engine untouched
                    _notify(loop, _set_exception, admitted, exc)
                else:
                    if _notify(loop, _set_result, admitted, None):
                        self._streams[request_id] = (loop, stream)
                    else:
                        self.engine.abort(request_id)
            elif kind == "abort":
                self.engine.abort(payload)
                self._streams.pop(payload, None)
            elif kind == "call":
                fn, args, future = payload
                if not future.set_running_or_notify_cancel():
                    continue  # its caller gave up waiting
                try:
                    future.set_result(fn(self.engine, *args))
                except Exception as exc:
                    future.set_exception(exc)

    def _loop(self) -> None:
        try:
            while not self._stopped:
                self._drain_inbox()
                if not self.engine.has_unfinished():
                    self.last_progress = time.monotonic()  # idle is not stuck
                    self._wake.wait(0.5)
                    self._wake.clear()
                    continue
                self._step()
            self._drain_inbox()
        finally:  # shut down, or the loop itself broke: never leave a stream hanging
            self._fail_all(EngineDeadError("engine shut down before the request finished"))

    def _step(self) -> None:
        try:
            outputs = self.engine.step()
        except Exception as exc:  # no single request to blame: the engine's state is suspect
            log.exception("engine step failed")
            self.engine.mark_unhealthy(f"engine step failed: {exc!r}")
            self._fail_all(EngineDeadError(f"engine step failed: {exc!r}"))
            return
        self.last_progress = time.monotonic()
        # One wake-up per event loop per step, carrying every stream's output of the step, rather than
        # one per stream: a failed request gets its error, the others get their deltas.
        batches: dict[asyncio.AbstractEventLoop, list] = {}
        for out in outputs:
            target = self._streams.get(out.request_id)
            if target is None:
                continue
            loop, stream = target
            batches.setdefault(loop, []).append(
                (out.request_id, stream, out if out.error is None else out.error)
            )
            if out.finished:
                del self._streams[out.request_id]
        for loop, batch in batches.items():
            if not _notify(loop, _put_all, batch):  # that loop is closed: nobody listens to its streams
                for request_id, _, _ in batch:
                    self._streams.pop(request_id, None)

    def _send(self, request_id: str, item, last: bool) -> None:
        target = self._streams.get(request_id)
        if target is None:
            return
        loop, stream = target
        if not _notify(loop, stream.put_nowait, item) or last:
            self._streams.pop(request_id, None)

    def _fail_all(self, exc: Exception) -> None:
        for request_id in list(self.engine.seqs):
            self.engine.abort(request_id)
        for request_id in list(self._streams):
            self._send(request_id, exc, True)


def _notify(loop: asyncio.AbstractEventLoop, fn, *args) -> bool:
    """Run fn(*args) on a caller's event loop; False when that loop is closed (nobody is listening)."""
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:
        return False
    return True


def _put_all(batch: list[tuple[str, asyncio.Queue, object]]) -> None:
    for _, stream, item in batch:
        stream.put_nowait(item)


def _set_result(fut: asyncio.Future, value) -> None:
    if not fut.done():
        fut.set_result(value)


def _set_exception(fut: asyncio.Future, exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)
