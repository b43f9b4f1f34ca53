"""Incremental detokenization and stop-string matching for one request."""

from __future__ import annotations


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas without re-decoding everything.

    Decoding a short window (from `prefix_offset`) keeps each step O(1); a delta is released only
    once it no longer ends in an incomplete UTF-8 sequence ("\\ufffd").
    """

    def __init__(self, tokenizer, prompt_ids: list[int]) -> None:
        self.tokenizer = tokenizer
        self.ids = list(prompt_ids[-6:])  # a little prompt context so the first word gets its spacing
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self.text = ""

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        if self.tokenizer is None:
            return ""
        decode = lambda ids: self.tokenizer.decode(ids, skip_special_tokens=True)
        prefix = decode(self.ids[self.prefix_offset : self.read_offset])
        full = decode(self.ids[self.prefix_offset :])
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            delta = full[len(prefix) :]
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
            self.text += delta
            return delta
        return ""


def find_stop(text: str, new_chars: int, stops: tuple[str, ...]) -> int | None:
    """Where the earliest stop string starts in `text`; only looks where the new text could end one."""
    best = None
    for stop in stops:
        begin = max(0, len(text) - new_chars - len(stop) + 1)
        i = text.find(stop, begin)
        if i != -1 and (best is None or i < best):
            best = i
    return best
