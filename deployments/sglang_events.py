"""SGLang's streamed chunks as our StreamEvents, and our SamplingParams as SGLang's (pure).

SGLang 0.5.23's stream contract (`Engine.async_generate(..., stream=True)`, chunks built in
tokenizer_manager.py `_handle_batch_output` / `_wait_one_response`), with incremental_streaming_output
left at its default (False):
- every chunk is cumulative: `text` and `output_ids` hold everything generated so far, and output_ids
  is SGLang's live list, not a copy, so only slices of it are kept here;
- a reader that falls behind gets the latest state only (earlier chunks are dropped, not queued), so a
  slow consumer receives fewer, larger events, as our own replica merges them;
- `meta_info.finish_reason` is None until the last chunk, then {"type": "stop"|"length"|"abort", ...};
  an abort with a 4xx/5xx `status_code` is SGLang refusing or failing the request;
- the speculation counters (spec_verify_ct, spec_num_correct_drafts, spec_num_proposed_drafts and, in
  compact mode, spec_cap_length) arrive on the final chunk only, so earlier events carry zeros.
"""

from __future__ import annotations

from dataclasses import dataclass

from deployments.events import StreamEvent
from dspark.errors import AdmissionError, InvalidRequestError, RequestFailedError
from dspark.outputs import SpeculationStats
from dspark.sampling_params import SamplingParams

NO_SPECULATION = SpeculationStats(0, 0, 0, 0.0)


def sampling_params(params: SamplingParams) -> dict:
    """SGLang's sampling_params dict (srt/sampling/sampling_params.py) for ours."""
    out = {
        "max_new_tokens": params.max_tokens,
        # SGLang decodes temperature 0 greedily; ours is greedy below 1e-5.
        "temperature": 0.0 if params.greedy else params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k if params.top_k > 0 else -1,
        "ignore_eos": params.ignore_eos,
        "no_stop_trim": params.include_stop_str_in_output,
    }
    if params.stop:
        out["stop"] = list(params.stop)
    if params.stop_token_ids:
        out["stop_token_ids"] = list(params.stop_token_ids)
    if params.seed is not None:
        out["sampling_seed"] = params.seed
    return out


def speculation(meta: dict) -> SpeculationStats:
    """Our per-request speculation stats from a final chunk's meta_info (zeros when SGLang sent none)."""
    rounds = int(meta.get("spec_verify_ct", 0))
    if rounds <= 0:
        return NO_SPECULATION
    accepted = int(meta.get("spec_num_correct_drafts", 0))
    proposed = int(meta.get("spec_num_proposed_drafts", 0))  # what the drafter drafted
    cap_length = meta.get("spec_cap_length")  # mean verify window per step, bonus slot included
    if cap_length is not None:  # compact mode: only the scheduled drafts went to the target
        verified = round(cap_length * rounds) - rounds
    else:
        verified = proposed
    # SGLang reports no acceptance by position per request: left empty rather than guessed.
    return SpeculationStats(
        rounds, verified, accepted, (accepted + rounds) / rounds, proposed_tokens=proposed
    )


@dataclass
class ChunkReader:
    """Turns one request's cumulative chunks into delta events."""

    request_id: str
    prompt_tokens: int
    text: str = ""
    num_ids: int = 0

    def event(self, chunk: dict) -> StreamEvent | None:
        """The event for this chunk; None when it adds nothing; raises when SGLang refused the request."""
        meta = chunk.get("meta_info", {})
        reason = meta.get("finish_reason")
        kind = reason.get("type") if isinstance(reason, dict) else reason
        if kind == "abort" and isinstance(reason, dict) and reason.get("status_code"):
            raise _refusal(int(reason["status_code"]), str(reason.get("message", "")))
        ids = chunk.get("output_ids") or []
        new_ids = tuple(ids[self.num_ids :])  # a copy: SGLang keeps appending to its list
        self.num_ids = len(ids)
        text = chunk.get("text") or ""
        new_text = text[len(self.text) :]  # SGLang's text only ever grows (ReqState.append_text)
        self.text = text
        finished = reason is not None
        if not (new_ids or new_text or finished):
            return None
        return StreamEvent(
            self.request_id,
            new_text,
            new_ids,
            finished,
            kind,
            int(meta.get("prompt_tokens", self.prompt_tokens)),
            int(meta.get("completion_tokens", self.num_ids)),
            speculation(meta) if finished else NO_SPECULATION,
        )


def _refusal(status: int, message: str) -> Exception:
    if status in (429, 503):  # SGLang's queue is full or it is pausing: come back later
        return AdmissionError(f"SGLang: {message}", retry_after_s=1.0)
    if 400 <= status < 500:
        return InvalidRequestError("request", f"SGLang refused it: {message}")
    return RequestFailedError(f"SGLang failed the request: {message}")
