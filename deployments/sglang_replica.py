"""SGLangReplica: SGLang's engine (with its own DSpark) as a target replica, same surface as TargetReplica.

Deployed under the same name (`TargetReplica`), so the ingress, GetLoads and the router see no
difference: `generate` streams our StreamEvents, `record_routing_stats` publishes load from SGLang's own
load snapshots, `check_health` reports a stalled or exiting engine, `set_draft_budget` is the
controller's actuator, and `__del__` shuts SGLang down after Serve's graceful drain. The cluster
controller's methods (`controller_snapshot`, `apply_caps`, `set_sts_temperatures`,
`rescale_cost_table`) are TargetReplica's, as far as SGLang can apply them at runtime: a cap or a
push it cannot apply comes back as a refusal naming the field, a reason code and why, never as a silent
no-op; the rest of a budget still applies (a step cap as SGLang's budget per running request).

The engine is `sglang.Engine` (TP 1: its scheduler and detokenizer are child processes of this replica)
or `sglang.srt.ray.engine.RayEngine` (TP > 1: one scheduler actor per rank in this replica's placement
group, one GPU per bundle). Only SGLang's asynchronous tokenizer-manager calls are used, on this
replica's event loop: the Engine's synchronous helpers run their own loop and would block this one.

Telemetry: each request runs in a span of ours, "{operation} {model}" (GenAI naming), the child of the
caller's span when the ingress passes its W3C context (`trace_context`); its own context goes to SGLang as
`external_trace_header`, so SGLang's spans (exported to the same OTLP endpoint, sglang_args.py) join the
trace. The spans use the OpenTelemetry API; the replica installs this process's providers from the
OTEL_* environment (deployments/telemetry.py), so with no endpoint set they cost nothing and go nowhere.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import asdict

from opentelemetry import propagate, trace
from ray import serve

from deployments import sglang_budget
from deployments.config import AppConfig
from deployments.events import StreamEvent
from deployments.replica_state import TauWindow
from deployments.sglang_args import translate
from deployments.sglang_artifacts import is_profiled_sps_table, read_sps_points
from deployments.sglang_events import ChunkReader, sampling_params
from deployments.telemetry import setup_process
from dspark.async_engine import CALL_TIMEOUT_S
from dspark.draft_budget import DraftBudget
from dspark.errors import InvalidRequestError
from dspark.outputs import SpeculationStats
from dspark.sampling_params import SamplingParams
from router.policy import Newcomer

log = logging.getLogger(__name__)
tracer = trace.get_tracer("deployments.sglang_replica")
TEXT_COMPLETION = "text_completion"  # gen_ai.operation.name of /v1/completions and gRPC Generate


@serve.deployment(name="TargetReplica")
class SGLangReplica:
    def __init__(self, config: dict) -> None:
        self.config = AppConfig(**config)
        self.telemetry = setup_process("replica")  # the global provider the spans below go to
        self.launch = translate(self.config, os.environ)
        os.environ.update(self.launch.env)  # SGLang reads them here and in its child processes
        module, _, name = self.launch.engine_class.partition(":")
        engine_class = getattr(importlib.import_module(module), name)
        kwargs = dict(self.launch.server_args)
        if self.launch.uses_ray_engine:
            import ray

            # Serve's placement group of this replica: bundle i holds rank i's GPU.
            kwargs["placement_group"] = ray.util.get_current_placement_group()
        self.engine = engine_class(**kwargs)
        self.tokenizer_manager = self.engine.tokenizer_manager
        self.stats_timeout_s = CALL_TIMEOUT_S
        self._streams: dict[str, str] = {}  # SGLang rid -> the client's request id, in flight
        self._last_output = time.monotonic()
        self._tau = TauWindow()
        self._rounds = self._accepted = self._finished = self._aborted = 0
        self._verified = 0  # drafted tokens SGLang verified, finished requests
        self._controller_mark = (0, 0, 0)  # (rounds, accepted, verified) at the controller's last reading
        self._stream_class: dict[str, str] = {}  # SGLang rid -> SLA class, in flight
        self._budget_frac: float | None = None
        self._step_cap: tuple[int, int] | None = None  # (K, running) when the frac came from a step cap
        self._gamma: int | None = self.launch.gamma
        self._last_stats: dict = {}
        sps = self.launch.server_args.get("speculative_dspark_sps_table_path")
        self._sps_table = read_sps_points(sps) if sps else None
        self._sps_profiled = is_profiled_sps_table(sps)  # else SGLang's compact mode verifies all

    async def generate(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        request_id: str,
        trace_context: dict[str, str] | None = None,
        operation: str = TEXT_COMPLETION,
        route: Newcomer | None = None,
    ) -> AsyncIterator[StreamEvent]:
        """Stream one request; cancelling this call (client gone) or `abort(request_id)` aborts it inside
        SGLang. `request_id` is the client's label; SGLang sees a unique rid of ours. `trace_context`: the
        caller's W3C context, which this request's span continues; `operation`: the GenAI operation;
        `route`: what the SLA router read to place the request (router/serve_router.py), unused here."""
        # SGLang aborts by rid PREFIX (scheduler.py: req.rid.startswith(rid)); fixed-length uuids never
        # prefix one another, whatever ids clients choose.
        rid = uuid.uuid4().hex
        reader = ChunkReader(request_id, len(prompt_token_ids))
        # A span of its own, not the current one: this generator suspends at every yield.
        parent = propagate.extract(trace_context) if trace_context else None
        span = tracer.start_span(f"{operation} {self.config.model_name}", context=parent)
        span.set_attributes(_request_attributes(operation, self.config.model_name, request_id, params))
        header: dict[str, str] = {}
        propagate.inject(header, context=trace.set_span_in_context(span))
        finished = False
        try:
            stream = await self.engine.async_generate(
                input_ids=list(prompt_token_ids),
                sampling_params=sampling_params(params),
                stream=True,
                rid=rid,
                external_trace_header=header or None,
            )
            self._streams[rid] = request_id
            self._stream_class[rid] = params.sla_class or ""
            try:
                async for chunk in stream:
                    self._last_output = time.monotonic()
                    event = reader.event(chunk)
                    if event is None:
                        continue
                    finished = event.finished
                    if finished:
                        self._count_finished(event)
                        span.set_attributes(_result_attributes(event))
                    yield event
                    if finished:
                        return
            finally:
                self._streams.pop(rid, None)
                self._stream_class.pop(rid, None)
                if not finished:
                    self._aborted += 1
                    self.tokenizer_manager.abort_request(rid)  # idempotent, fire-and-forget
                await stream.aclose()
        except BaseException as exc:
            if not isinstance(exc, GeneratorExit | asyncio.CancelledError):
                span.record_exception(exc)
                span.set_status(trace.Status(trace.StatusCode.ERROR, str(exc)))
            raise
        finally:
            span.set_attribute("dspark.finished", finished)
            span.end()

    async def abort(self, request_id: str) -> int:
        """End every request running here under this client id (Abort fans out to every replica); SGLang
        then ends each stream with finish_reason abort."""
        rids = [rid for rid, client in self._streams.items() if client == request_id]
        for rid in rids:
            self.tokenizer_manager.abort_request(rid)
        return len(rids)

    def _count_finished(self, event: StreamEvent) -> None:
        self._finished += 1
        self._aborted += event.finish_reason == "abort"
        self._rounds += event.speculation.rounds
        self._accepted += event.speculation.accepted_tokens
        self._verified += event.speculation.drafted_tokens

    async def model_info(self) -> dict:
        return {
            "max_model_len": int(self.tokenizer_manager.context_len),
            "vocab_size": int(self.tokenizer_manager.model_config.vocab_size),
            "drafter": self.config.engine.get("drafter", "none"),
            "num_speculative_tokens": await self._block_size(),
            "tensor_parallel_size": self.config.tensor_parallel_size,
            "backend": "sglang",
        }

    async def _block_size(self) -> int | None:
        """gamma as SGLang resolved it (its verify window minus the bonus token)."""
        if self._gamma is None and self.config.engine.get("drafter") == "dspark":
            state = (await self._internal_state())[0]
            self._gamma = int(state["speculative_num_draft_tokens"]) - 1
        return self._gamma

    async def record_routing_stats(self) -> dict:
        """What the router scores replicas by, from SGLang's load snapshots; the last good reading if
        SGLang is slow to answer."""
        return await self._load_stats(router=True)

    async def _load_stats(self, router: bool) -> dict:
        """`router`: the router's reading, which moves its tau window (the controller keeps its own)."""
        try:
            loads = await asyncio.wait_for(self.tokenizer_manager.get_loads(), self.stats_timeout_s)
        except Exception as exc:
            log.warning("SGLang load unavailable (%r); publishing the last reading", exc)
            return {**self._last_stats, "healthy": False}
        capacity = sum(load.max_total_num_tokens for load in loads)
        used = sum(load.num_used_tokens for load in loads)
        stats = {
            "backend": "sglang",
            "running_requests": sum(load.num_running_reqs for load in loads),
            "queued_requests": sum(load.num_waiting_reqs for load in loads),
            "queued_prefill_tokens": sum(load.num_waiting_uncached_tokens for load in loads),
            "kv_total_tokens": capacity,
            "kv_headroom": (capacity - used) / capacity if capacity else 0.0,
            "max_num_seqs": sum(load.max_running_requests for load in loads),
            "finished_requests": self._finished,
            "aborted_requests": self._aborted,
            "recent_tau": self._tau.update(self._rounds, self._accepted) if router else self._tau.tau,
            "draft_budget": self._in_force(),
            "sps_table": self._sps_table,
            "healthy": self._problem() is None,
            "replica_id": _replica_id(),
        }
        if router:
            self._last_stats = stats
        return stats

    async def get_state(self) -> dict:
        """Admin: the routing stats plus SGLang's own state (first DP rank) and the model."""
        stats = await self.record_routing_stats()
        state = (await self._internal_state())[0]
        keep = ("avg_spec_accept_length", "last_gen_throughput", "effective_max_running_requests_per_dp")
        engine = {key: state[key] for key in keep if key in state}
        return {**stats, "engine": engine, "model": await self.model_info()}

    async def set_draft_budget(self, budget: dict) -> dict:
        """Admin: the controller's actuator. Applies what SGLang can apply faithfully, refuses the rest
        (InvalidRequestError naming the field, sglang_budget.py); returns the budget in force."""
        parsed = DraftBudget.from_dict(budget)
        gamma = await self._block_size()
        if self.config.engine.get("drafter") != "dspark" or gamma is None:
            if parsed.unlimited:
                return sglang_budget.in_force(None, None, self.launch.verify_mode, self._sps_profiled)
            raise _no_drafter()
        running = await self._running() if parsed.max_step_tokens else 0
        frac = sglang_budget.force_budget_frac(
            parsed, gamma, self.launch.verify_mode, self._sps_profiled, running
        )
        if self.launch.verify_mode == "compact" and self._sps_profiled:
            from sglang.srt.managers.io_struct import SetInternalStateReq

            request = SetInternalStateReq(server_args={sglang_budget.KNOB: frac})
            applying = self.tokenizer_manager.set_internal_state(request)
            updated = await asyncio.wait_for(applying, CALL_TIMEOUT_S)
            if not all(updated):
                raise RuntimeError(f"SGLang did not apply {sglang_budget.KNOB}={frac} (per rank: {updated})")
            self._budget_frac = frac
            binds = parsed.max_step_tokens is not None and running > 0
            self._step_cap = (parsed.max_step_tokens, running) if binds else None
        return self._in_force()

    async def _running(self) -> int:
        loads = await asyncio.wait_for(self.tokenizer_manager.get_loads(), self.stats_timeout_s)
        return sum(load.num_running_reqs for load in loads)

    # ---- the cluster controller's surface (deployments/controller.py) ----------------------------------
    # As TargetReplica's: caps arrive by broadcast and each replica takes its own entry. SGLang reports
    # spec stats per finished request (rounds, accepted, verified), so acceptance by position is the
    # geometric law that explains them (controller/telemetry.py), and there is no round sample for STS.

    async def controller_snapshot(self) -> dict:
        """The routing stats, and the controller's window of spec stats since its previous reading."""
        stats = await self._load_stats(router=False)
        rounds, accepted, verified = self._rounds, self._accepted, self._verified
        r0, a0, v0 = self._controller_mark
        self._controller_mark = (rounds, accepted, verified)
        d_rounds = rounds - r0
        return {
            **stats,
            "window_rounds": d_rounds,
            "recent_tau": (accepted - a0 + d_rounds) / d_rounds if d_rounds else 0.0,
            "mean_verified": (verified - v0) / d_rounds if d_rounds else 0.0,
            "draft_window": await self._block_size() or 0,
            # SGLang's planner picks each step's budget itself only in compact mode with a profiled table.
            "adaptive_verify": self.launch.verify_mode == "compact" and self._sps_profiled,
            "sts_temperatures": {},
            "running_by_class": dict(Counter(self._stream_class.values())),
            "ts": time.time(),
        }

    async def apply_caps(self, budgets: dict[str, dict]) -> dict | None:
        """Set this replica's budget if `budgets` (replica id -> budget) names it: what SGLang can apply is
        applied (sglang_budget.py), each field it cannot comes back in `refusals` with a reason code, and
        `draft_budget` is what is in force afterwards."""
        rid = _replica_id()
        if rid not in budgets:
            return None
        try:
            parsed = DraftBudget.from_dict(budgets[rid])
        except InvalidRequestError as exc:
            return {
                "replica_id": rid,
                "refusals": [_refusal(exc.field, str(exc))],
                "draft_budget": self._in_force(),
            }
        kept, refused = sglang_budget.split(parsed, self.launch.verify_mode, self._sps_profiled)
        refusals = [r.to_dict() for r in refused]
        try:
            in_force = await self.set_draft_budget(asdict(kept))
        except InvalidRequestError as exc:  # no drafter: nothing to apply
            refusals.append(_refusal(exc.field, str(exc)))
            in_force = self._in_force()
        return {"replica_id": rid, "refusals": refusals, "draft_budget": in_force}

    async def set_sts_temperatures(self, temperatures: dict) -> dict:
        """Refused: SGLang 0.5.23 sets no confidence temperatures at runtime."""
        return {
            "replica_id": _replica_id(),
            "refused": _refusal("sts_temperatures", NO_RUNTIME_STS, "sglang_no_runtime_sts"),
        }

    async def rescale_cost_table(self, slowdowns: dict[str, float]) -> dict | None:
        """Refused for this replica if `slowdowns` names it: SGLang reads its SPS table at start only."""
        rid = _replica_id()
        if rid not in slowdowns:
            return None
        return {
            "replica_id": rid,
            "refused": _refusal("sps_table", NO_RUNTIME_SPS, "sglang_sps_table_at_start_only"),
        }

    def _in_force(self) -> dict:
        return sglang_budget.in_force(
            self._budget_frac, self._gamma, self.launch.verify_mode, self._sps_profiled, self._step_cap
        )

    async def _internal_state(self) -> list[dict]:
        return await asyncio.wait_for(self.tokenizer_manager.get_internal_state(), self.stats_timeout_s)

    def check_health(self) -> None:
        problem = self._problem()
        if problem is not None:
            raise RuntimeError(f"replica unhealthy: {problem}")

    def _problem(self) -> str | None:
        if self.tokenizer_manager.gracefully_exit:
            return "SGLang is shutting down"
        quiet = time.monotonic() - self._last_output
        if self._streams and quiet > self.config.stuck_after_s:
            return f"no output from SGLang for {quiet:.0f}s with {len(self._streams)} requests in flight"
        return None

    def __del__(self) -> None:
        # Serve first waits for in-flight requests (graceful_shutdown_timeout_s); SGLang's shutdown then
        # ends its schedulers (RayEngine: kills its actors) and the detokenizer.
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.shutdown()


# Why the controller's recalibration pushes are refused: SGLang 0.5.23's set_internal_state updates
# pp_max_micro_batch_size, speculative_accept_threshold_*, dspark_force_budget_frac and
# dspark_clear_info_records only (scheduler_components/internal_state.py).
NO_RUNTIME_STS = (
    "SGLang 0.5.23 has no runtime setter for the drafter's STS temperatures (set_internal_state takes "
    "dspark_force_budget_frac, not temperatures); restart the replica with the refitted drafter to apply them"
)
NO_RUNTIME_SPS = (
    "SGLang 0.5.23 reads its SPS table (sglang.sps_table) at start only; no runtime setter rescales it. "
    "Re-profile and restart the replica to apply a drifted table"
)


def _refusal(field: str, message: str, reason: str = "sglang_refused") -> dict:
    return {"field": field, "reason": reason, "message": message}


def _no_drafter() -> InvalidRequestError:
    return InvalidRequestError("budget", "this replica serves without a drafter: there is no draft budget")


def _request_attributes(operation: str, model: str, request_id: str, params: SamplingParams) -> dict:
    return {
        "gen_ai.operation.name": operation,
        "gen_ai.request.model": model,
        "gen_ai.request.max_tokens": params.max_tokens,
        "gen_ai.request.temperature": params.temperature,
        "dspark.request_id": request_id,
        "dspark.backend": "sglang",
    }


def _result_attributes(event: StreamEvent) -> dict:
    spec: SpeculationStats = event.speculation
    return {
        "gen_ai.usage.input_tokens": event.prompt_tokens,
        "gen_ai.usage.output_tokens": event.completion_tokens,
        "gen_ai.response.finish_reasons": [event.finish_reason or ""],
        "dspark.rounds": spec.rounds,
        "dspark.verified_tokens": spec.drafted_tokens,
        "dspark.accepted_tokens": spec.accepted_tokens,
        "dspark.mean_accept_length": spec.mean_accept_length,
    }


def _replica_id() -> str:
    try:
        return serve.get_replica_context().replica_id.unique_id
    except Exception:  # outside Serve (tests calling the class directly)
        return "local"
