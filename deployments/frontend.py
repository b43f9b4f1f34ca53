"""What the HTTP and gRPC surfaces share: auth, model check, prompt rendering and tokenization,
context-length checks, and Abort.

A request reaches a target replica only once it is valid; the first event is awaited before a
response starts, so refusals (400/429) are statuses, never half-sent streams.

The ingress runs as several replicas and keeps no request state of its own: Abort asks every target
replica (deployments/running.py), so it finds a request whichever ingress admitted it, and a
request_id reused across ingresses runs twice, harmlessly, rather than colliding. Chat templating and
tokenization of bodies up to max_request_bytes run on a small thread pool, never on the event loop
that carries every other stream of this ingress; only a short prompt (INLINE_PROMPT_CHARS), whose
tokenization costs less than the hop to the pool, is tokenized on the loop.

Each request is a span (dspark/telemetry/spans.py): the surface starts it within the client's trace,
`open` hands its context to the replica, and the stream ends it with the usage and the replica's
speculation attributes of the last event.

With `stream_mux` (the default under the SLA router), a request's own replica call carries only its
first event, which names the replica; its later events arrive on this ingress' one subscription to
that replica, shared by all its streams there (deployments/mux_client.py), and are handed to the
Stream by a queue. The request's call stays open until the request ends, so a client that leaves
still cancels it and the replica aborts the request. When that subscription is open as the request
starts, its first event comes on it too, and the earlier copy is taken (`first_message`).

Each request carries its routing inputs to the SLA router (router/serve_router.py), which runs in this
process: its prompt length, max_tokens and SLA class (router/sla.py), as the `route` keyword of the
replica call. The router's decision for it (scores per replica, the pick or the refusal) is collected
once the first event or the refusal arrives: logged (debug) with the request id and kept on the Stream
as `route`, and recorded as the `dspark.route` event of the request's span (router/decisions.py).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from jinja2 import TemplateError
from opentelemetry import trace
from opentelemetry.trace import SpanKind

from deployments.config import AppConfig
from deployments.errors import UnauthorizedError, classify, unwrap
from deployments.events import StreamEvent, received
from deployments.ingress_admission import IngressAdmission, Slot
from deployments.mux_client import Subscriptions
from deployments.stream_mux import unpack_first
from deployments.telemetry import setup_process
from deployments.validation import GenerationRequest, Limits
from dspark.errors import InvalidRequestError
from dspark.prefix_cache import route_hashes
from dspark.telemetry.semconv import TEXT_COMPLETION
from dspark.telemetry.spans import RequestSpan
from router import decisions
from router.policy import Newcomer, PromptPages
from router.sla import classes_of, resolve

log = logging.getLogger(__name__)

# Used when a tokenizer ships no chat template (the demo tokenizer, the test tokenizer).
FALLBACK_CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
# Prompts tokenized at once; more wait their turn. HF fast tokenizers release the GIL while encoding.
TOKENIZER_THREADS = 4
# A prompt this short is tokenized on the event loop instead: a fast tokenizer takes 0.1-0.3 ms on it,
# less than the pool's hop (a pool thread's wake-up, then the loop's), which cost 0.5-2 ms of time to
# first token on a busy 2-CPU host. Chat messages always go to the pool (their template may be long).
INLINE_PROMPT_CHARS = 512
INLINE_PROMPT_IDS = 2048
ABORT_TIMEOUT_S = 10.0


@dataclass
class Stream:
    """One admitted request's events, starting with the first (already received) one."""

    request_id: str
    prompt_tokens: int
    first: StreamEvent
    _source: object  # DeploymentResponseGenerator
    span: RequestSpan | None = None
    route: dict | None = None  # the SLA router's decision (router/policy.py Decision.to_dict)
    slot: Slot | None = None  # its place at this ingress (deployments/ingress_admission.py)
    # Multiplexed (deployments/mux_client.py): the events after the first arrive on this queue.
    _muxed: asyncio.Queue | None = None
    _mux: Subscriptions | None = None
    _key: str = ""

    async def events(self) -> AsyncIterator[StreamEvent]:
        last = self.first
        try:
            yield self.first
            while not last.finished:
                if self._muxed is not None:
                    item = await self._muxed.get()
                    if isinstance(item, BaseException):
                        raise item
                    event = StreamEvent.from_wire(item)
                else:
                    try:
                        event = received(await self._source.__anext__())
                    except StopAsyncIteration:
                        return
                last = event
                yield event
        except Exception as exc:
            fail_span(self.span, exc)
            raise
        finally:
            if self._mux is not None:
                self._mux.unregister(self._key)
            if self.slot is not None:
                self.slot.release()
            if not last.finished:
                self._source.cancel()  # the client left: the replica aborts and frees the KV blocks
            if self.span is not None and last.finished:
                span_attrs = last.span_attributes
                self.span.finish(last.finish_reason, last.prompt_tokens, last.completion_tokens, span_attrs)
            elif self.span is not None:
                self.span.end()


def fail_span(span: RequestSpan | None, exc: BaseException) -> None:
    """Record a failed request on its span: the replica's error type; an error status for 5xx only."""
    if span is not None:
        span.fail(unwrap(exc), server_fault=classify(exc).http_status >= 500)


class Frontend:
    def __init__(self, replica, config: AppConfig) -> None:
        from transformers import AutoTokenizer

        self.replica = replica
        self.config = config
        self.limits = Limits(max_request_bytes=config.max_request_bytes)
        self.api_keys = config.accepted_api_keys()
        self.slas = classes_of(config.sla_classes)
        self.model_name = config.model_name
        self.created = int(time.time())
        self.tokenizer = AutoTokenizer.from_pretrained(config.engine_config().model, trust_remote_code=False)
        self._tokenize_pool = ThreadPoolExecutor(TOKENIZER_THREADS, thread_name_prefix="tokenize")
        self._info: dict | None = None
        queued = None if config.max_queued_requests < 0 else config.max_queued_requests
        self.admission = IngressAdmission(config.ingress_running, queued)
        self.telemetry = setup_process("ingress")
        self.mux = (
            Subscriptions(replica, socket=config.stream_mux_transport == "socket")
            if config.stream_mux_applies
            else None
        )

    async def model_info(self) -> dict:
        """The engine's own view (context length, drafter), fetched from a replica once."""
        if self._info is None:
            info = await self.replica.model_info.remote()
            self._info = {**info, "model": self.model_name, "num_replicas": self.config.num_replicas}
        return self._info

    def authorize(self, authorization: str | None) -> None:
        if not self.api_keys:
            return
        token = (authorization or "").removeprefix("Bearer ").strip()
        if not any(hmac.compare_digest(token, key) for key in self.api_keys):
            raise UnauthorizedError("missing or invalid bearer token")

    def request_span(self, operation: str, carrier: Mapping[str, str] | None) -> RequestSpan:
        """A new request's span. Over HTTP, FastAPI's server span (which continued the client's
        `traceparent`) is current and ours becomes its child; over gRPC nothing is, and ours is the
        server span, continuing the context in `carrier` (the call's metadata)."""
        if trace.get_current_span().get_span_context().is_valid:
            return RequestSpan(self.telemetry.tracer, operation, self.model_name, None, SpanKind.INTERNAL)
        return RequestSpan(self.telemetry.tracer, operation, self.model_name, carrier, SpanKind.SERVER)

    async def open(
        self,
        req: GenerationRequest,
        span: RequestSpan | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Stream:
        """Take a place at this ingress (or refuse with 429), validate against the model, then admit
        the request on a replica and await its first event. The Stream gives the place back when it
        ends, or when it is collected unread (a client gone before its response started).

        `headers`: the HTTP headers or gRPC metadata (lower-case names), for the SLA headers."""
        slot = self.admission.enter()
        try:
            stream = await self._open(req, span, headers)
        except BaseException:
            slot.release()
            raise
        stream.slot = slot
        weakref.finalize(stream, slot.release)
        return stream

    async def _open(
        self, req: GenerationRequest, span: RequestSpan | None, headers: Mapping[str, str] | None
    ) -> Stream:
        if span is not None:
            span.set_request(req.params, req.model)
        if req.model is not None and req.model != self.model_name:
            raise InvalidRequestError(
                "model", f"unknown model {req.model!r}; this server serves {self.model_name!r}"
            )
        sla = resolve(self.slas, self.config.default_sla_class, req.sla_class, headers or {})
        params = replace(req.params, sla_class=sla.name)  # the engine's per-class draft budget reads it
        info = await self.model_info()
        loop = asyncio.get_running_loop()
        if tokenize_inline(req):
            ids, pages = self.routed_prompt(req, info)
        else:
            ids, pages = await loop.run_in_executor(self._tokenize_pool, self.routed_prompt, req, info)
        rid = req.request_id or uuid.uuid4().hex
        route = Newcomer(len(ids), params.max_tokens, sla, key=uuid.uuid4().hex[:12], prefix=pages)
        mux, key, muxed = self.mux, "", None
        extra = {}
        if mux is not None:  # registered before the call: later events may overtake the first
            key, muxed = mux.register()
            extra["mux"] = (mux.channel, key)
        source = self.replica.options(stream=True).generate.remote(
            ids,
            params,
            rid,
            route=route,
            trace_context=span.carrier() if span is not None else None,
            operation=span.operation if span is not None else TEXT_COMPLETION,
            **extra,
        )
        replica_id = None  # which replica answered, where the first event says (the muxed stream's)
        try:
            if mux is None:
                first = received(await source.__anext__())
            else:
                replica_id, message, address = await first_message(source, mux.first(key))
                first = received(message)
        except BaseException:
            source.cancel()
            if mux is not None:
                mux.unregister(key)
            collect_decision(rid, route, span)
            raise
        stream = Stream(rid, len(ids), first, source, span, collect_decision(rid, route, span, replica_id))
        if mux is not None:
            if first.finished:
                mux.unregister(key)
            else:
                mux.placed(key, replica_id, address)
                stream._muxed, stream._mux, stream._key = muxed, mux, key
        return stream

    async def abort(self, request_id: str) -> bool:
        """Stop every running request with this id, whichever ingress admitted it: each target replica
        ends its own (Ray Serve's broadcast reaches every replica, not one picked by the router)."""
        counts = await self.replica.broadcast("abort", request_id).results_async(
            timeout_s=ABORT_TIMEOUT_S, return_exceptions=True
        )
        # A replica that died meanwhile runs nothing any more: its error counts as nothing aborted.
        return any(isinstance(n, int) and n > 0 for n in counts)

    def routed_prompt(self, req: GenerationRequest, info: dict) -> tuple[list[int], PromptPages | None]:
        """The prompt's token ids and, for the SLA router when the replicas cache prefixes, its pages'
        names: hashed here, once, off the event loop, so the router only matches them per replica."""
        ids = self.prompt_ids(req, info)
        page_size = info.get("kv_page_size")
        if self.config.router != "sla" or not info.get("prefix_caching") or not page_size:
            return ids, None
        return ids, PromptPages(int(page_size), tuple(route_hashes(ids, int(page_size))))

    def prompt_ids(self, req: GenerationRequest, info: dict) -> list[int]:
        """The prompt as token ids, checked against the model's context and vocabulary (thread-safe)."""
        ids = self._token_ids(req)
        limit = info["max_model_len"]
        field = req.prompt_field
        if not ids:
            raise InvalidRequestError(field, "must not be empty")
        if len(ids) >= limit:
            raise InvalidRequestError(
                field, f"{len(ids)} tokens do not fit the model's context of {limit} tokens"
            )
        if len(ids) + req.params.max_tokens > limit:
            raise InvalidRequestError(
                "max_tokens",
                f"{req.params.max_tokens} new tokens after a {len(ids)}-token prompt exceed the model's "
                f"context of {limit} tokens",
            )
        if bad := [t for t in ids if not 0 <= t < info["vocab_size"]]:
            raise InvalidRequestError(field, f"token ids must be in [0, {info['vocab_size']}), got {bad[0]}")
        return ids

    def _token_ids(self, req: GenerationRequest) -> list[int]:
        if req.prompt_token_ids is not None:
            return list(req.prompt_token_ids)
        if req.messages is not None:
            template = self.tokenizer.chat_template or FALLBACK_CHAT_TEMPLATE
            try:
                text = self.tokenizer.apply_chat_template(
                    req.messages, chat_template=template, tokenize=False, add_generation_prompt=True
                )
            except TemplateError as exc:  # a template's raise_exception(): e.g. roles must alternate
                raise InvalidRequestError(
                    "messages", f"the model's chat template refused them: {exc}"
                ) from None
            return self.tokenizer.encode(text, add_special_tokens=False)
        # Exactly what Engine.tokenize does, so served output equals offline output for the same text.
        return self.tokenizer.encode(req.prompt, add_special_tokens=False)


def tokenize_inline(req: GenerationRequest) -> bool:
    """Whether the prompt is short enough to tokenize on the event loop (INLINE_PROMPT_CHARS)."""
    if req.prompt_token_ids is not None:
        return len(req.prompt_token_ids) <= INLINE_PROMPT_IDS
    return req.messages is None and req.prompt is not None and len(req.prompt) <= INLINE_PROMPT_CHARS


async def first_message(source, copy: asyncio.Future) -> tuple[str, bytes, tuple[str, int, str] | None]:
    """A muxed request's first event as (replica id, event bytes, the replica's socket address): from
    the request's call (`stream_mux.pack_first`) or, if it comes first, from its copy on the open
    subscription (`copy`, deployments/stream_mux.py; no address then: the subscription has it). A
    refusal comes on the call only, as its error."""
    call = asyncio.ensure_future(source.__anext__())
    try:
        await asyncio.wait((call, copy), return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # the client left meanwhile
        call.cancel()
        raise
    finally:
        copy.cancel()
    if call.done():  # the call's message came first (or at once with the copy), or its error
        return unpack_first(call.result())
    call.add_done_callback(_retrieve)  # read no further: the call's own first message is dropped
    replica_id, event = copy.result()
    return replica_id, event, None


def _retrieve(task: asyncio.Future) -> None:
    """Mark an unread call's outcome as seen (the stream's end cancels it, or a later error ends it)."""
    if not task.cancelled():
        task.exception()


def collect_decision(
    request_id: str, route: Newcomer, span: RequestSpan | None = None, answered_by: str | None = None
) -> dict | None:
    """The SLA router's decision for this request (None under Serve's routers): logged with its id and
    recorded as the `dspark.route` event of the request's span, the scores of every replica included;
    `answered_by` the replica its first event came from, if known (decisions.pop)."""
    decision = decisions.pop(route.key, answered_by)
    if decision is not None:
        log.debug("route %s: %s", request_id, json.dumps(decision, separators=(",", ":")))
        if span is not None:
            span.add_event(decisions.EVENT, decisions.event_attributes(decision))
    return decision
