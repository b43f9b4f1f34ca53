"""Automatic prefix caching: which full KV pages of earlier prompts a new prompt can reuse
(docs/ALGORITHM.md §12).

A page is named by a hash chained over every token up to its end (the hash of the page before it and
its own token ids), so two prompts share page k exactly when their first (k + 1) pages of tokens are
equal: a page's K/V depend on every token before it, and nothing else (vLLM's automatic prefix
caching names its blocks the same way). The hash is a 128-bit BLAKE2b digest, stable across processes
and machines, so a router can name a prompt's pages without asking a replica; each cached page also
keeps its own token ids and its parent's hash, and a match compares both, so the cache never relies
on the absence of collisions for what it reuses.

Only full pages of prompts are cached, and only once their K/V are committed: decoding never writes
them (it writes at positions past the prompt), so a shared page is never written and rolling back
rejected drafts never touches one. A page also carries the tapped hidden states of its tokens, which
a learned drafter reads as context: a request that reuses the page hands the drafter exactly what
the target's forward produced for those tokens, without running the target on them.

This module is pure bookkeeping over page ids (dspark/kv_cache.py owns the pages and their reference
counts); the hidden states travel as an opaque payload.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Container, Sequence
from dataclasses import dataclass

ROOT = 0  # the parent hash of a prompt's first page
HASH_BYTES = 16
# What a replica publishes for routing: the hashes of cached pages at the start of prompts (where
# shared system prompts sit), the most recently used first, each cut to 64 bits (16 hex digits):
# enough to tell prompts apart for a prediction, compact enough to push several times a second.
ROUTE_MAX_DEPTH = 64  # pages: a prompt's first 64 pages (1,024 tokens at 16 per page)
ROUTE_MAX_HASHES = 256


def page_hash(parent: int, tokens: Sequence[int]) -> int:
    """The hash of a page holding `tokens` after the page whose hash is `parent`."""
    digest = hashlib.blake2b(parent.to_bytes(HASH_BYTES, "little"), digest_size=HASH_BYTES)
    digest.update(array("q", tokens).tobytes())
    return int.from_bytes(digest.digest(), "little")


def page_hashes(token_ids: Sequence[int], page_size: int, max_pages: int | None = None) -> list[int]:
    """The chained hashes of the full pages of `token_ids` (a partial last page has none)."""
    count = len(token_ids) // page_size
    if max_pages is not None:
        count = min(count, max_pages)
    hashes, parent = [], ROOT
    for k in range(count):
        parent = page_hash(parent, token_ids[k * page_size : (k + 1) * page_size])
        hashes.append(parent)
    return hashes


def route_hash(full: int) -> str:
    """The short name of a page hash that routing stats carry."""
    return f"{full >> (8 * HASH_BYTES - 64):016x}"


def route_hashes(token_ids: Sequence[int], page_size: int) -> list[str]:
    """The short names (`route_hash`) of the prompt pages a replica could serve from its cache: the
    full pages among a prompt's first ROUTE_MAX_DEPTH, less the last token's (it always runs: it makes
    the first output token). A router hashes a prompt once and matches it against every replica."""
    usable = token_ids[: max(0, len(token_ids) - 1)]
    return [route_hash(h) for h in page_hashes(usable, page_size, ROUTE_MAX_DEPTH)]


def held_prefix_pages(hashes: Sequence[str], held: Container[str]) -> int:
    """How many of a prompt's leading pages (named by `route_hashes`) a replica holding `held` caches."""
    hits = 0
    for h in hashes:
        if h not in held:
            break
        hits += 1
    return hits


def cached_prefix_tokens(token_ids: Sequence[int], summary: dict) -> int:
    """How many leading tokens of a prompt a replica holds, by its routing summary
    (`PageManager.routing_summary`): the prefill a router can expect it to skip. A prediction: the
    replica may evict the pages before the request arrives, and the hashes are cut to 64 bits."""
    page_size, held = int(summary.get("page_size", 0)), set(summary.get("hashes", ()))
    if page_size <= 0 or not held:
        return 0
    return held_prefix_pages(route_hashes(token_ids, page_size), held) * page_size


@dataclass
class CachedPage:
    """A full, committed prompt page whose K/V any prompt with the same tokens up to its end may reuse."""

    page: int  # the KV page id
    hash: int
    parent: int  # the hash of the page before it (ROOT for a prompt's first page)
    tokens: tuple[int, ...]
    depth: int  # its index in the prompt: 0 for the first page
    payload: object = None  # the tapped hidden states of its tokens, for a drafter; None without one
    last_used: int = 0  # the page manager's clock at its last use


class PrefixIndex:
    """The cached pages by hash and by page id."""

    def __init__(self) -> None:
        self._by_hash: dict[int, CachedPage] = {}
        self._by_page: dict[int, CachedPage] = {}
        self.version = 0  # counts additions and removals: what a summary of the index was taken at

    def __len__(self) -> int:
        return len(self._by_page)

    def __contains__(self, page: int) -> bool:
        return page in self._by_page

    def get(self, page: int) -> CachedPage | None:
        return self._by_page.get(page)

    def entries(self):
        return iter(self._by_page.values())

    def lookup(self, hash_: int, parent: int, tokens: Sequence[int]) -> CachedPage | None:
        """The cached page holding exactly `tokens` after the page named `parent`, if any."""
        entry = self._by_hash.get(hash_)
        if entry is None or entry.parent != parent or entry.tokens != tuple(tokens):
            return None
        return entry

    def add(self, entry: CachedPage) -> bool:
        """Cache a page; False when a page with these tokens is cached already (the newcomer stays
        private: two requests that prefilled the same prefix at once keep one copy in the cache)."""
        if entry.hash in self._by_hash or entry.page in self._by_page:
            return False
        self._by_hash[entry.hash] = self._by_page[entry.page] = entry
        self.version += 1
        return True

    def remove(self, page: int) -> CachedPage | None:
        entry = self._by_page.pop(page, None)
        if entry is not None:
            del self._by_hash[entry.hash]
            self.version += 1
        return entry

    def clear(self) -> None:
        self._by_hash.clear()
        self._by_page.clear()
        self.version += 1
