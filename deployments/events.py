"""What a target replica streams to the ingress: one small event per engine step that changed a request.

Only the delta travels (never the cumulative token list), so a long stream costs O(n) in transfer;
events that pile up while the consumer is busy travel merged (`coalesce`), one message per hop. An
event pickles as a flat tuple of builtins (`__reduce__`): every message pays its serialization in the
replica, whose GIL the engine thread shares, and a dataclass costs cloudpickle about four times more.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace

from dspark.outputs import RequestOutput, SpeculationStats

_SPECULATION_FIELDS = tuple(f.name for f in fields(SpeculationStats))


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

    def __reduce__(self):
        spec = tuple(getattr(self.speculation, name) for name in _SPECULATION_FIELDS)
        attrs = None if self.span_attributes is None else dict(self.span_attributes)
        return _from_wire, (
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
        )

    def usage(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }


def _from_wire(
    rid, text, token_ids, finished, reason, prompt, completion, spec, cached, attrs
) -> StreamEvent:
    return StreamEvent(
        rid, text, token_ids, finished, reason, prompt, completion, SpeculationStats(*spec), cached, attrs
    )


def coalesce(first: object, pending: asyncio.Queue) -> tuple[object, object | None]:
    """`first` and every StreamEvent already waiting in `pending` behind it, as one event: what a
    replica sends when the engine ran several steps while the previous message was on its way.

    Returns (what to send now, what to act on after it): a non-event (an error, an abort signal) that
    waited behind tokens is held back, so the tokens before it are sent first. Never waits: when the
    consumer keeps up, `pending` is empty and `first` goes out alone, as soon as it was produced."""
    event = first
    while isinstance(event, StreamEvent) and not event.finished and not pending.empty():
        nxt = pending.get_nowait()
        if not isinstance(nxt, StreamEvent):
            return event, nxt
        event = event.then(nxt)
    return event, None


async def coalesce_interval(
    first: object, pending: asyncio.Queue, min_tokens: int
) -> tuple[object, object | None]:
    """Like `coalesce`, then, while the merged event carries fewer than `min_tokens` tokens and is not
    the last, waits for the engine's next steps: a stream interval (vLLM's and SGLang's
    `stream_interval`), fewer messages per token on every hop at the price of the time between them.
    A non-event (an error, an abort) arriving meanwhile ends the wait and is held back, as in
    `coalesce`. With `min_tokens` 1 it is `coalesce`: nothing waits."""
    event, held = coalesce(first, pending)
    if min_tokens <= 1:
        return event, held
    while held is None and isinstance(event, StreamEvent) and not event.finished:
        if len(event.token_ids) >= min_tokens:
            break
        nxt = await pending.get()
        if not isinstance(nxt, StreamEvent):
            return event, nxt
        event, held = coalesce(event.then(nxt), pending)
    return event, held
