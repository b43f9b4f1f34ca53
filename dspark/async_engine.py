"""AsyncEngine: the engine on a background thread, with asyncio streams of deltas per request.

The step loop owns the engine; callers talk to it through an inbox drained between steps, so no lock
is held across a forward and the event loop never blocks on the model.
"""

from __future__ import annotations

import asyncio
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

    def is_healthy(self, stuck_after_s: float = 30.0) -> bool:
        """False when the loop died, or has work but made no progress for `stuck_after_s`."""
        if self._stopped or not self._thread.is_alive():
            return False
        return not self.engine.has_unfinished() or time.monotonic() - self.last_progress < stuck_after_s

    async def generate(
        self, prompt: str | Seq[int], params: SamplingParams | None = None, request_id: str | None = None
    ) -> AsyncIterator[RequestOutput]:
        """Stream one request's outputs (each carries its delta); abandoning the stream aborts it."""
        if self._stopped:
            raise EngineDeadError("engine is shut down")
        request_id = request_id or uuid.uuid4().hex
        loop = asyncio.get_running_loop()
        admitted: asyncio.Future = loop.create_future()
        stream: asyncio.Queue = asyncio.Queue()
        self._call("add", (prompt, params, request_id, loop, stream, admitted))
        await admitted  # raises InvalidRequestError / AdmissionError exactly as Engine.add_request does
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

    def abort(self, request_id: str) -> None:
        self._call("abort", request_id)

    def call(self, fn, *args):
        """Run fn(engine, *args) on the engine thread between steps (admin: budgets, state)."""
        done: queue.SimpleQueue = queue.SimpleQueue()
        self._call("call", (fn, args, done))
        ok, value = done.get()
        if not ok:
            raise value
        return value

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Stop the loop; every request still running is failed explicitly with EngineDeadError."""
        self._stopped = True
        self._wake.set()
        self._thread.join(timeout_s)

    # ---- engine thread ----------------------------------------------------------------------------

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
                    loop.call_soon_threadsafe(_set_exception, admitted, exc)
                else:
                    self._streams[request_id] = (loop, stream)
                    loop.call_soon_threadsafe(_set_result, admitted, None)
            elif kind == "abort":
                self.engine.abort(payload)
                self._streams.pop(payload, None)
            elif kind == "call":
                fn, args, done = payload
                try:
                    done.put((True, fn(self.engine, *args)))
                except Exception as exc:
                    done.put((False, exc))

    def _loop(self) -> None:
        while not self._stopped:
            self._drain_inbox()
            if not self.engine.has_unfinished():
                self._wake.wait(0.5)
                self._wake.clear()
                continue
            try:
                outputs = self.engine.step()
            except Exception as exc:  # never leave a stream hanging: fail everything in flight
                log.exception("engine step failed")
                self._fail_all(EngineDeadError(f"engine step failed: {exc!r}"))
                continue
            self.last_progress = time.monotonic()
            for out in outputs:
                target = self._streams.get(out.request_id)
                if target is None:
                    continue
                loop, stream = target
                loop.call_soon_threadsafe(stream.put_nowait, out)
                if out.finished:
                    self._streams.pop(out.request_id, None)
        self._drain_inbox()
        self._fail_all(EngineDeadError("engine shut down before the request finished"))

    def _fail_all(self, exc: Exception) -> None:
        for request_id in list(self.engine.seqs):
            self.engine.abort(request_id)
        for loop, stream in self._streams.values():
            loop.call_soon_threadsafe(stream.put_nowait, exc)
        self._streams.clear()


def _set_result(fut: asyncio.Future, value) -> None:
    if not fut.done():
        fut.set_result(value)


def _set_exception(fut: asyncio.Future, exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)
