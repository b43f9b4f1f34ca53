"""What the HTTP and gRPC surfaces share: auth, model check, prompt rendering and tokenization,
context-length checks, and the table of in-flight requests (for Abort and duplicate ids).

A request reaches a target replica only once it is valid; the first event is awaited before a
response starts, so refusals (400/429) are statuses, never half-sent streams.
"""

from __future__ import annotations

import hmac
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace

from jinja2 import TemplateError

from deployments.config import AppConfig
from deployments.errors import DuplicateRequestError, UnauthorizedError
from deployments.events import StreamEvent
from deployments.validation import GenerationRequest, Limits
from dspark.errors import InvalidRequestError

# Used when a tokenizer ships no chat template (the demo tokenizer, the test tokenizer).
FALLBACK_CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


@dataclass
class Stream:
    """One admitted request's events, starting with the first (already received) one."""

    request_id: str
    prompt_tokens: int
    first: StreamEvent
    _source: object  # DeploymentResponseGenerator
    _frontend: Frontend

    async def events(self) -> AsyncIterator[StreamEvent]:
        last, finished = self.first, self.first.finished
        try:
            yield self.first
            while not finished:
                try:
                    event = await self._source.__anext__()
                except StopAsyncIteration:
                    return
                except Exception:
                    if self.request_id not in self._frontend.aborted:
                        raise
                    # Aborted through Abort: end the stream the way the engine ends an aborted request.
                    yield replace(last, text="", token_ids=(), finished=True, finish_reason="abort")
                    return
                last, finished = event, event.finished
                yield event
        finally:
            if not finished:
                self._source.cancel()  # the client left: the replica aborts and frees the KV blocks
            self._frontend.inflight.pop(self.request_id, None)
            self._frontend.aborted.discard(self.request_id)


class Frontend:
    def __init__(self, replica, config: AppConfig) -> None:
        from transformers import AutoTokenizer

        self.replica = replica
        self.config = config
        self.limits = Limits(max_request_bytes=config.max_request_bytes)
        self.api_keys = config.accepted_api_keys()
        self.model_name = config.model_name
        self.created = int(time.time())
        self.tokenizer = AutoTokenizer.from_pretrained(config.engine_config().model, trust_remote_code=False)
        self.inflight: dict[str, object] = {}
        self.aborted: set[str] = set()
        self._info: dict | None = None

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

    async def open(self, req: GenerationRequest) -> Stream:
        """Validate against the model, then admit the request on a replica and await its first event."""
        if req.model is not None and req.model != self.model_name:
            raise InvalidRequestError(
                "model", f"unknown model {req.model!r}; this server serves {self.model_name!r}"
            )
        ids = self._token_ids(req)
        info = await self.model_info()
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
        rid = req.request_id or uuid.uuid4().hex
        if rid in self.inflight:
            raise DuplicateRequestError(f"request_id: {rid!r} is already running")
        source = self.replica.options(stream=True).generate.remote(ids, req.params, rid)
        self.inflight[rid] = source
        try:
            first = await source.__anext__()
        except BaseException:
            self.inflight.pop(rid, None)
            source.cancel()
            raise
        return Stream(rid, len(ids), first, source, self)

    def abort(self, request_id: str) -> bool:
        source = self.inflight.get(request_id)
        if source is None or request_id in self.aborted:
            return False
        self.aborted.add(request_id)
        source.cancel()
        return True

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
