"""TargetReplica: one engine (the target with its drafter colocated) as a Ray Serve deployment.

With tensor_parallel_size N the replica is rank 0 of N shard processes in its STRICT_PACK placement
group (deployments/tensor_parallel.py). Serve calls `record_routing_stats` for the router and
`check_health` to replace a replica whose engine loop died, stopped making progress, or reports
itself broken, and `reconfigure` when it changes the replica's rank: with `engine_by_rank` the engine
is then rebuilt for the new rank (deployments/replica_engine.py). Every call into the engine thread
is awaited on the event loop with a deadline, so a stuck engine is reported, never waited on, and
costs no thread.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import replace

import ray
import torch
from ray import serve
from ray.serve.schema import ReplicaRank

from deployments import (
    mux_socket,
    replica_control,
    replica_engine,
    replica_state,
    running,
    stream_mux,
    thread_policy,
)
from deployments.config import AppConfig
from deployments.errors import classify
from deployments.events import StreamEvent, coalesce_interval
from deployments.serve_context import replica_context
from deployments.telemetry import setup_process
from deployments.tensor_parallel import KEEPALIVE_PERIOD_S
from dspark.async_engine import CALL_TIMEOUT_S
from dspark.engine import Engine
from dspark.errors import AdmissionError
from dspark.outputs import RequestOutput
from dspark.sampling_params import SamplingParams
from dspark.telemetry.engine_telemetry import EngineTelemetry
from dspark.telemetry.semconv import TEXT_COMPLETION
from dspark.verify_policy import SCHEDULED_MODES
from router.policy import Newcomer

log = logging.getLogger(__name__)
DRAIN_POLL_S = 0.05  # how often a rebuild checks whether the requests running here have finished


@serve.deployment(name="TargetReplica")
class TargetReplica:
    def __init__(self, config: dict) -> None:
        self.config = AppConfig(**config)
        if self.config.torch_num_threads:
            torch.set_num_threads(self.config.torch_num_threads)
        self.telemetry = setup_process("replica", prometheus=True)
        self._rank = _replica_rank()  # the Serve rank whose engine runs here
        self._builds = 1  # engines built here: more than one when Serve moved the replica to another rank
        self._rebuilding: str | None = None  # why new requests are refused while the engine is rebuilt
        self._rebuild_lock = asyncio.Lock()
        self.stats_timeout_s = CALL_TIMEOUT_S
        self._keepalive: asyncio.Task | None = None
        self._running = running.RunningRequests()
        self._outboxes = stream_mux.Outboxes()  # by ingress channel: events waiting for its subscription
        self._mux_server: mux_socket.MuxServer | None = None  # the socket transport's, once started
        built = replica_engine.build(self.config, self.config.engine_config(self._rank))
        self._telemetry = EngineTelemetry(
            self.telemetry, built.engine.engine, self.config.model_name, _replica_id()
        )
        self._install(built)

    def _install(self, built: replica_engine.ReplicaEngine) -> None:
        """Make `built` this replica's engine, with fresh windows on its counters."""
        self._built = built
        self._tp_group, self._tap, self._routing_table = built.tp_group, built.tap, built.routing_table
        self.engine = built.engine
        self._recent = replica_state.RecentRounds()
        self._forwards = replica_state.RecentForwards()
        self._last_stats: dict = {}
        self._published = replica_state.Republisher()
        self._pending_snapshot: asyncio.Future | None = None  # at most one stats call queued at a time
        # The engine thread keeps its CPU: the serving threads (Serve's, Ray's, the event loop, the
        # socket's) yield to it on wake-up; again after a rebuild, whose engine thread a worker started.
        # Only a Serve replica owns its process: called directly (tests, benches), the class must leave
        # its caller's threads as they were.
        engine_thread = self.engine.thread_id
        thread_policy.name_thread(engine_thread, thread_policy.ENGINE_THREAD_NAME)
        if replica_context() is not None:
            thread_policy.apply(self.config.serving_thread_policy, {engine_thread}, self.config.engine_cpu)

    async def reconfigure(self, user_config: None, rank: ReplicaRank | None = None) -> None:
        """Serve's call at start and whenever it changes this replica's rank (deployments/replica_engine.py):
        the engine is rebuilt when the new rank's engine differs from the one running."""
        if rank is None:  # Serve lost track of the rank (a controller restart): keep the engine
            return
        async with self._rebuild_lock:
            wanted = self.config.engine_config(rank.rank)
            if wanted == self._built.config:
                self._rank = rank.rank
                return
            self._rebuilding = f"replica is rebuilding its engine for Serve rank {rank.rank}"
            log.warning("Serve rank now %d: rebuilding the engine for it", rank.rank)
            try:
                await self._drain(self.config.graceful_shutdown_timeout_s)
                if self._keepalive is not None:
                    self._keepalive.cancel()
                    self._keepalive = None
                await asyncio.to_thread(self._built.stop)
                built = await asyncio.to_thread(replica_engine.build, self.config, wanted)
                self._telemetry.attach(built.engine.engine)
                self._install(built)
                self._rank, self._builds = rank.rank, self._builds + 1
            finally:
                self._rebuilding = None

    async def _drain(self, timeout_s: float) -> None:
        """Wait until no request runs here; after `timeout_s`, abort those left (finish_reason abort)."""
        deadline = time.monotonic() + timeout_s
        while len(self._running) and time.monotonic() < deadline:
            await asyncio.sleep(DRAIN_POLL_S)
        if aborted := self._running.abort_all():
            log.warning("aborted %d requests still running after %gs", aborted, timeout_s)

    async def generate(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        request_id: str,
        route: Newcomer | None = None,
        trace_context: dict[str, str] | None = None,
        operation: str = TEXT_COMPLETION,
        mux: tuple[str, str] | None = None,
    ) -> AsyncIterator[bytes]:
        """Stream one request, each event as its bytes (`StreamEvent.to_wire`; the ingress reads them
        with `events.received`); cancelling this call (client gone) or `abort(request_id)` aborts it and
        frees its KV blocks. `request_id` is the client's label (deployments/running.py).
        `trace_context`: the ingress span's W3C context, which this replica's span continues;
        `operation`: the GenAI operation the request serves (text_completion, chat).

        `route` is what the SLA router read to place the request (router/serve_router.py); the call
        carries it so Serve shows it to the router, and the replica has no use for it.

        Each message costs a hop through Ray, so whatever the engine produced while the previous
        message was in flight is sent as one merged event rather than one per step. With the app's
        `stream_interval` N > 1, a message after the first also waits until it carries N tokens (or
        the request ends).

        `mux` (channel, key): the ingress reads this request's events after the first from its
        subscription to this replica (a connection to this replica's socket, deployments/mux_socket.py,
        or `subscribe(channel)`; deployments/stream_mux.py), where they travel with its other streams'
        events of the same step, under `key`. The first message then carries this replica's id and
        socket address too (`stream_mux.pack_first`); when the subscription is open then, a copy of
        the first event goes on it too, which the ingress takes if it comes first; nothing follows
        it here: the call
        stays open until the request ends, so cancelling it still aborts the request, and Serve's
        routers still count the request as running here until then.
        """
        if self._rebuilding is not None:
            raise AdmissionError(self._rebuilding, retry_after_s=max(1.0, self._built.build_s))
        received = time.monotonic()  # the last event's `timing` starts here
        self._ensure_keepalive()
        engine_id = running.engine_request_id(request_id, route.key if route is not None else None)
        trace = self._telemetry.start(engine_id, request_id, operation, params, trace_context)
        # The engine thread puts the request's outputs (or the error that ended it) straight into this
        # queue, where `abort` puts its signal too: no task or second queue between engine and stream.
        pending: asyncio.Queue = asyncio.Queue()
        engine = self.engine  # the one this request runs on, even if a rebuild installs another

        def event_of(item: object) -> object:
            """An engine output as the event to stream; an error or the abort signal as itself."""
            if not isinstance(item, RequestOutput):
                return item
            event = StreamEvent.of(item)
            if item.finished:
                m = item.metrics
                timing = (
                    None
                    if m is None
                    else (received, m.arrival_time, m.first_scheduled_time, m.first_token_time)
                )
                event = replace(
                    event, span_attributes=trace.finished(item), timing=timing, replica=_replica_id()
                )
            return event

        interval = self.config.stream_interval
        # Muxed, each step's output goes from the engine's delivery straight to the outbox after the
        # first event (stream_mux.Relay); with a stream interval the loop below gathers tokens instead.
        relay = stream_mux.Relay(pending, event_of, running.ABORTED) if mux and interval == 1 else None
        held = None  # an error or an abort that arrived behind tokens: acted on after they are sent
        last = StreamEvent.before_any(engine_id, len(prompt_token_ids))
        ended = False  # the engine is done with the request (finished, failed or refused)
        outbox = None  # where events after the first go (mux), once the first went out
        self._running.add(request_id, pending)
        try:
            try:
                await engine.open(prompt_token_ids, params, engine_id, relay or pending)
            except Exception as exc:  # admission refusals, engine shut down: the caller's error
                ended = True
                trace.failed(exc, server_fault=classify(exc).http_status >= 500)
                raise
            while True:
                first = held if held is not None else event_of(await pending.get())
                # The first tokens always go at once (time to first token); later ones per the interval.
                event, held = await coalesce_interval(
                    first, pending, interval if last.completion_tokens else 1, event_of
                )
                if isinstance(event, Exception):  # the request failed, or the engine shut down
                    ended = True
                    trace.failed(event, server_fault=classify(event).http_status >= 500)
                    if outbox is None:
                        raise event
                    outbox.put(mux[1], stream_mux.pack_error(event), stream_mux.ERROR)
                    return
                aborted = event is running.ABORTED
                if aborted:
                    event = last.aborted()
                wire = event.to_wire()
                if outbox is not None:
                    outbox.put(mux[1], wire, stream_mux.LAST if event.finished else stream_mux.EVENT)
                elif mux is None:
                    yield wire
                else:  # the first event: the ingress learns where to subscribe
                    address = await self._mux_address()
                    outbox = self._outboxes[mux[0]]
                    outbox.open(mux[1])
                    outbox.copy_first(mux[1], wire)  # on an open subscription, likely there first
                    yield stream_mux.pack_first(_replica_id(), wire, address)
                    if relay is not None and not event.finished:
                        relay.attach(outbox, mux[1], event, held)
                        while (item := await pending.get()) is not stream_mux.END:
                            relay.put_nowait(item)  # an abort's signal
                        ended = not relay.was_aborted
                        if relay.error is not None:
                            trace.failed(relay.error, server_fault=classify(relay.error).http_status >= 500)
                        return
                last = event
                if event.finished:
                    ended = not aborted
                    return
        finally:
            if relay is not None:
                relay.close()
            self._running.discard(request_id, pending)
            if outbox is not None:
                outbox.close(mux[1])
                self._outboxes.release(mux[0])
            if not ended:  # aborted, or the client left: the engine stops it and frees its KV pages
                engine.abort(engine_id)
            trace.close()  # a request that left early ends its span here

    async def _mux_address(self) -> tuple[str, int, str] | None:
        """Where the ingress subscribes with the socket transport (None: through `subscribe`); the
        listening socket starts with the first muxed request."""
        if self.config.stream_mux_transport != "socket":
            return None
        if self._mux_server is None:
            self._mux_server = mux_socket.MuxServer(self._outboxes, _replica_id(), _node_ip())
        return await self._mux_server.start()

    async def subscribe(self, channel: str, pinned_replica: str) -> AsyncIterator[bytes]:
        """The ingress `channel`'s subscription here: the events of its streams after their first,
        a step's worth of them per message (deployments/stream_mux.py). It ends once none of its
        streams runs here, so no call stays open on an idle replica. `pinned_replica` is the replica
        the ingress asked for (the router pins the call to it, router/serve_router.py); a call that
        reached another is refused rather than left waiting for events that never come."""
        if pinned_replica != _replica_id():
            raise stream_mux.MisroutedError(f"subscription for {pinned_replica} reached {_replica_id()}")
        async for message in self._outboxes.subscribe(channel):
            yield message

    async def abort(self, request_id: str) -> int:
        """End every request running here under this client id (Abort fans out to every replica).

        Async so it runs on the event loop that owns the requests' queues, never on a worker thread."""
        return self._running.abort(request_id)

    def model_info(self) -> dict:
        engine = self.engine.engine
        return {
            "max_model_len": engine.max_model_len,
            "vocab_size": engine.model_config.vocab_size,
            "drafter": engine.drafter.name,
            "num_speculative_tokens": engine.gamma,
            "tensor_parallel_size": self.config.tensor_parallel_size,
            # The ingress names a prompt's pages for the SLA router's prefix affinity (router/policy.py).
            "kv_page_size": engine.pages.page_size,
            "prefix_caching": engine.pages.prefix_caching,
        }

    async def record_routing_stats(self) -> dict:
        """What the router scores replicas by; the last good reading if the engine is slow to answer."""
        self._ensure_keepalive()
        try:
            snap = await self._snapshot()
        except Exception as exc:  # stuck or dead: check_health reports it, the router keeps old numbers
            log.warning("routing stats unavailable (%r); publishing the last reading", exc)
            return {**self._last_stats, "healthy": False}
        forwards = {name: snap[name] for name in replica_state.FORWARD_COUNTERS}
        snap |= self._recent.update(*(snap.pop(name) for name in replica_state.COUNTERS), now=snap["ts"])
        snap |= self._forwards.update(**forwards)
        for name in ("steps", "forward_tokens"):  # raw counters: their rates above are what is read
            del snap[name]
        snap["healthy"] = self.engine.is_healthy(self.config.stuck_after_s)
        snap["replica_id"] = _replica_id()
        snap["engine_rank"], snap["engine_builds"] = self._rank, self._builds
        self._last_stats = self._published.publish(snap)
        return self._last_stats

    async def _snapshot(self) -> dict:
        """The engine's state, read on its thread within `stats_timeout_s`. While a read is still
        queued behind a slow step, later calls wait on that one instead of queueing more."""
        if self._pending_snapshot is None or self._pending_snapshot.done():
            read = self.engine.submit(replica_state.routing_snapshot, self._routing_table)
            self._pending_snapshot = asyncio.wrap_future(read)
            self._pending_snapshot.add_done_callback(_retrieve)
        try:
            return dict(await asyncio.wait_for(asyncio.shield(self._pending_snapshot), self.stats_timeout_s))
        except asyncio.TimeoutError:
            raise TimeoutError(f"no engine stats within {self.stats_timeout_s:g}s") from None

    async def get_state(self) -> dict:
        """Admin: the routing stats plus the engine's counters and the multiplexed streams' (since
        start: subscriptions served, messages sent, events they carried, first events copied onto an
        open subscription; ingress channels open)."""
        stats = await self.record_routing_stats()
        engine_stats = await self.engine.call_async(lambda e: e.stats.to_dict())
        mux = {**self._outboxes.counts, "channels": len(self._outboxes)}
        return {**stats, "engine": engine_stats, "model": self.model_info(), "stream_mux": mux}

    async def set_draft_budget(self, budget: dict) -> dict:
        """Admin: change the draft budget while requests run; returns the budget in force."""
        return await self.engine.call_async(replica_state.set_draft_budget, budget)

    # ---- the cluster controller's surface (deployments/controller.py) ----------------------------------
    # Caps arrive by Serve's broadcast, which reaches every replica: each takes its own entry, and a
    # replica the controller says nothing about (or a controller that is down) keeps the caps it has.

    async def controller_snapshot(self) -> dict:
        """The engine's state and the controller's window since its previous reading."""
        reading = await self.engine.call_async(self._controller_reading)
        healthy = self.engine.is_healthy(self.config.stuck_after_s)
        return {**reading, "replica_id": _replica_id(), "healthy": healthy, "ts": time.time()}

    def _controller_reading(self, engine: Engine) -> dict:
        snap = replica_state.snapshot(engine)
        return {
            **snap,
            **self._tap.read(),
            "draft_window": engine.gamma,
            "adaptive_verify": engine.cost_table is not None and engine.config.scheduler in SCHEDULED_MODES,
            "sts_temperatures": replica_control.sts_temperatures(engine),
            "running_by_class": replica_control.running_by_class(engine),
        }

    async def apply_caps(self, budgets: dict[str, dict]) -> dict | None:
        """Set this replica's draft budget if `budgets` (replica id -> budget) names it."""
        rid = _replica_id()
        if rid not in budgets:
            return None
        return {"replica_id": rid, "draft_budget": await self.set_draft_budget(budgets[rid])}

    async def set_sts_temperatures(self, temperatures: dict) -> dict:
        """Replace the drafter's STS temperatures (serving temperature -> T_1..T_γ); lossless."""
        temps = {float(t): [float(x) for x in v] for t, v in temperatures.items()}
        return await self.engine.call_async(replica_control.set_sts_temperatures, temps)

    async def rescale_cost_table(self, slowdowns: dict[str, float]) -> dict | None:
        """Rescale this replica's cost table if `slowdowns` (replica id -> factor) names it."""
        rid = _replica_id()
        if rid not in slowdowns:
            return None
        table = await self.engine.call_async(replica_control.rescale_cost_table, slowdowns[rid])
        return {"replica_id": rid, "sps_table": table}

    def check_health(self) -> None:
        if self._rebuilding is not None:  # the old engine is stopped on purpose; Serve waits for reconfigure
            return
        problem = self.engine.health_problem(self.config.stuck_after_s)
        if problem is not None:
            raise RuntimeError(f"replica unhealthy: {problem}")

    def __del__(self) -> None:
        # Serve first waits for in-flight requests (graceful_shutdown_timeout_s); whatever still runs
        # here is failed explicitly with EngineDeadError, which the ingress reports as 503 / UNAVAILABLE.
        telemetry = getattr(self, "telemetry", None)
        if telemetry is not None:
            telemetry.shutdown()  # exports what is pending
        # Stops listening only; open subscriptions keep their connections. Muxed requests' calls, which
        # the drain waited for, each ended once its last event was queued for its subscription, which
        # writes it on the event loop's next turn, well within the drain's seconds-long polling.
        mux_server = getattr(self, "_mux_server", None)
        if mux_server is not None:
            mux_server.close()
        engine = getattr(self, "engine", None)
        if engine is None:
            return
        if self._keepalive is not None:
            self._keepalive.cancel()
        engine.shutdown()
        if self._tp_group is not None:
            self._tp_group.stop(engine.engine)

    def _ensure_keepalive(self) -> None:
        # Started from the first async call: that is where the replica's event loop is running.
        if self._tp_group is not None and self._keepalive is None:
            self._keepalive = asyncio.get_running_loop().create_task(self._keep_group_alive())

    async def _keep_group_alive(self) -> None:
        while True:
            await asyncio.sleep(KEEPALIVE_PERIOD_S)
            try:
                await self.engine.call_async(lambda e: e.runner.keepalive(), timeout_s=KEEPALIVE_PERIOD_S)
            except Exception as exc:  # a stuck or dead engine: check_health reports it
                log.warning("tensor-parallel keepalive failed: %r", exc)


def _retrieve(future: asyncio.Future) -> None:
    """Mark a stats read's outcome as seen: it may finish after every caller stopped waiting."""
    if not future.cancelled():
        future.exception()


def _replica_rank() -> int:
    context = replica_context()
    return context.rank.rank if context is not None else 0


def _node_ip() -> str:
    """The address other nodes reach this one at (loopback outside a Ray cluster: tests)."""
    try:
        return ray.util.get_node_ip_address()
    except Exception:
        return "127.0.0.1"


def _replica_id() -> str:
    context = replica_context()
    return context.replica_id.unique_id if context is not None else "local"
