"""What a target replica streams to the ingress: one small event per engine step that changed a request.

Only the delta travels (never the cumulative token list), so a long stream costs O(n) in transfer;
events that pile up while the consumer is busy travel merged (`coalesce`), one message per hop.

A target replica streams each event as bytes (`to_wire`, msgpack of a flat tuple of builtins), which
Ray passes through as they are: any other object costs Ray a msgpack pass plus a cloudpickle per
message (measured with Ray's own serializer: 10.4 us for an event object, 0.3 us for bytes, plus 0.5 us
to pack them; in the replica, whose GIL the engine thread shares), and the ingress an unpickle. The
ingress reads either form (`received`): the SGLang replica streams event objects, which pickle as a
flat tuple of builtins (`__reduce__`), a dataclass costing cloudpickle four times more.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace

import msgpack

from dspark.outputs import RequestOutput, SpeculationStats

_SPECULATION_FIELDS = tuple(f.name for f in fields(SpeculationStats))
# StreamEvent.timing's stamps, in order (the OpenAI last chunk's `dspark.timing` names them so).
TIMING = ("received", "admitted", "scheduled", "first_token")


@dataclass(frozen=True)
class StreamEvent:
    request_id: str
    text: str
    token_ids: tuple[int, ...]
    finished: bool
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    speculation: SpeculationStats
    cached_tokens: int = 0  # prompt tokens served from the prefix cache (OpenAI's cached_tokens)
    # On the last event of a traced request: the replica span's speculation attributes (dspark.*), which
    # the ingress copies onto its own span.
    span_attributes: Mapping | None = None
    # On the last event of a target replica's request: when it reached the replica, when the engine
    # admitted it, ran its first prompt chunk and produced its first token (time.monotonic() of the
    # replica's host, TIMING's order): the engine's part of the time to first token, per request, at
    # the cost of one tuple per request (TPOT needs nothing: every token's event already carries it).
    timing: tuple[float, ...] | None = None
    # On the last event of a target replica's request: the replica that ran it (Serve's replica id), so a
    # client can tell which of the deployment's replicas served each request (bench/serving_cost.py's
    # open-loop runs set each replica's load beside the simulator's).
    replica: str | None = None

    @staticmethod
    def of(out: RequestOutput) -> StreamEvent:
        return StreamEvent(
            out.request_id,
            out.delta_text,
            tuple(out.delta_token_ids),
            out.finished,
            out.finish_reason,
            len(out.prompt_token_ids),
            len(out.token_ids),
            out.speculation,
            out.num_cached_tokens,
        )

    @staticmethod
    def before_any(request_id: str, prompt_tokens: int) -> StreamEvent:
        """What a request has produced before its first step: nothing."""
        return StreamEvent(request_id, "", (), False, None, prompt_tokens, 0, SpeculationStats(0, 0, 0, 0.0))

    def aborted(self) -> StreamEvent:
        """The last event of a stream aborted after this one: no new tokens, this event's totals."""
        return replace(self, text="", token_ids=(), finished=True, finish_reason="abort")

    def then(self, later: StreamEvent) -> StreamEvent:
        """This event and a later one of the same request as one event."""
        return replace(later, text=self.text + later.text, token_ids=self.token_ids + later.token_ids)

    def to_wire(self) -> bytes:
        """This event as one message's bytes (`from_wire` reads them back equal)."""
        # surrogatepass: a str that is not valid UTF-8 still travels exactly as it is.
        return msgpack.packb(self._fields(), unicode_errors="surrogatepass")

    @staticmethod
    def from_wire(data: bytes) -> StreamEvent:
        rid, text, token_ids, *rest = msgpack.unpackb(data, unicode_errors="surrogatepass")
        return _from_wire(rid, text, tuple(token_ids), *rest)

    def __reduce__(self):
        return _from_wire, self._fields()

    def _fields(self) -> tuple:
        spec = tuple(getattr(self.speculation, name) for name in _SPECULATION_FIELDS)
        attrs = None if self.span_attributes is None else dict(self.span_attributes)
        return (
            self.request_id,
            self.text,
            tuple(self.token_ids),
            self.finished,
            self.finish_reason,
            self.prompt_tokens,
            self.completion_tokens,
            spec,
            self.cached_tokens,
            attrs,
            self.timing,
            self.replica,
        )

    def usage(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }


def _same(item: object) -> object:
    return item


def received(item: StreamEvent | bytes) -> StreamEvent:
    """What a replica streamed, as an event: a target replica's bytes, or an event object (SGLang's)."""
    return StreamEvent.from_wire(item) if isinstance(item, bytes) else item


def _from_wire(
    rid, text, token_ids, finished, reason, prompt, completion, spec, cached, attrs, timing=None, replica=None
) -> StreamEvent:
    spec = SpeculationStats(*spec[:-1], tuple(spec[-1]))  # accepted_by_position: a tuple, as built
    timing = None if timing is None else tuple(timing)
    return StreamEvent(
        rid, text, token_ids, finished, reason, prompt, completion, spec, cached, attrs, timing, replica
    )


def coalesce(
    first: object, pending: asyncio.Queue, convert: Callable[[object], object] = _same
) -> tuple[object, object | None]:
    """`first` and every StreamEvent already waiting in `pending` behind it, as one event: what a
    replica sends when the engine ran several steps while the previous message was on its way.
    `convert` makes an event of what is taken from `pending` (the replica queues engine outputs).

    Returns (what to send now, what to act on after it): a non-event (an error, an abort signal) that
    waited behind tokens is held back, so the tokens before it are sent first. Never waits: when the
    consumer keeps up, `pending` is empty and `first` goes out alone, as soon as it was produced."""
    event = first
    while isinstance(event, StreamEvent) and not event.finished and not pending.empty():
        nxt = convert(pending.get_nowait())
        if not isinstance(nxt, StreamEvent):
            return event, nxt
        event = event.then(nxt)
    return event, None


async def coalesce_interval(
    first: object, pending: asyncio.Queue, min_tokens: int, convert: Callable[[object], object] = _same
) -> tuple[object, object | None]:
    """Like `coalesce`, then, while the merged event carries fewer than `min_tokens` tokens and is not
    the last, waits for the engine's next steps: a stream interval (vLLM's and SGLang's
    `stream_interval`), fewer messages per token on every hop at the price of the time between them.
    A non-event (an error, an abort) arriving meanwhile ends the wait and is held back, as in
    `coalesce`. With `min_tokens` 1 it is `coalesce`: nothing waits."""
    event, held = coalesce(first, pending, convert)
    if min_tokens <= 1:
        return event, held
    while held is None and isinstance(event, StreamEvent) and not event.finished:
        if len(event.token_ids) >= min_tokens:
            break
        nxt = convert(await pending.get())
        if not isinstance(nxt, StreamEvent):
            return event, nxt
        event, held = coalesce(event.then(nxt), pending, convert)
    return event, held
