"""Paged KV cache: fixed-size pages, per-sequence page tables, reservation-based admission, rollback,
and automatic prefix caching (dspark/prefix_cache.py).

A request reserves, at admission, the pages its longest possible life needs (prompt + max_tokens), so
the cache can never run out under a running request: exhaustion is always a refusal of the newcomer.
Blocks are still handed out lazily, so an early stop returns what was never used.

With prefix caching, a page holds a reference count: full, committed prompt pages are shared by every
request whose prompt starts with the same tokens, and a request's reservation counts the pages it
reuses once, as the pages they are. A cached page no request holds stays cached, and is evicted, least
recently used first, only when a page is needed and no uncached page is free: a referenced page is
never evicted, and a page is only ever written by the one request that holds it alone.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import torch

from dspark.errors import AdmissionError
from dspark.prefix_cache import (
    ROOT,
    ROUTE_MAX_DEPTH,
    ROUTE_MAX_HASHES,
    CachedPage,
    PrefixIndex,
    page_hashes,
    route_hash,
)


def pages_for(num_tokens: int, page_size: int) -> int:
    return -(-num_tokens // page_size)


@dataclass
class _Allocation:
    reserved: int  # pages this sequence may ever hold
    table: list[int] = field(default_factory=list)
    # Prefix caching: the prompt, the hashes of its full pages, and how many leading full pages are
    # settled (reused from the cache, or offered to it once committed).
    prompt: Sequence[int] = ()
    hashes: list[int] = field(default_factory=list)
    settled: int = 0


class PageManager:
    """Pure accounting of KV pages; knows nothing about tensors (a cached page's payload is opaque)."""

    def __init__(self, num_pages: int, page_size: int, prefix_caching: bool = False) -> None:
        self.num_pages, self.page_size = num_pages, page_size
        self._free: deque[int] = deque(range(num_pages))  # held by no one, caching nothing
        self._refs = [0] * num_pages
        self._evictable: OrderedDict[int, None] = OrderedDict()  # cached, held by no one; LRU first
        self.index = PrefixIndex() if prefix_caching else None
        self._clock = 0  # ticks on every use of a cached page: what "recently used" means
        self._summary: tuple[tuple[int, int], dict] | None = None  # routing_summary at (index version, clock)
        self.evictions = 0  # cached pages dropped to make room
        self._seqs: dict[str, _Allocation] = {}
        # Pages reserved by the running sequences and not yet in their tables, kept as a running total:
        # admission reads it for every request, and a sum over the running sequences cost O(running).
        self._promised = 0

    @property
    def prefix_caching(self) -> bool:
        return self.index is not None

    @property
    def num_free_pages(self) -> int:
        """Pages no request holds (cached ones included: they are evicted when needed)."""
        return len(self._free) + len(self._evictable)

    @property
    def num_cached_pages(self) -> int:
        return len(self.index) if self.index is not None else 0

    @property
    def num_unreserved_pages(self) -> int:
        """Blocks neither held nor promised to a running sequence: the admission headroom."""
        return self.num_free_pages - self._promised

    def refcount(self, page: int) -> int:
        return self._refs[page]

    def reserve(
        self, seq_id: str, max_tokens: int, prompt: Sequence[int] = (), need_payload: bool = False
    ) -> list[CachedPage]:
        """Admit a sequence of at most `max_tokens` tokens whose prompt is `prompt`, or refuse it.

        With prefix caching, the leading pages of the prompt found in the cache join its table at once
        (returned, in order); they count once, as the shared pages they are. `need_payload`: only
        pages that carry a payload (the drafter's context) are reused.
        """
        need = pages_for(max_tokens, self.page_size)
        if need > self.num_pages:
            raise AdmissionError(
                f"KV cache too small: the request needs {need} pages of {self.page_size} tokens "
                f"({max_tokens} tokens) but the cache has {self.num_pages} in total",
                retry_after_s=0.0,
            )
        alloc = _Allocation(reserved=need)
        if self.index is not None:
            alloc.prompt, alloc.hashes = prompt, page_hashes(prompt, self.page_size)
        hits = self._match(alloc, need_payload)
        # Fresh pages it may take, plus the cached pages it revives from the free pool.
        wanted = need - len(hits) + sum(1 for e in hits if self._refs[e.page] == 0)
        if wanted > self.num_unreserved_pages:
            raise AdmissionError(
                f"KV cache exhausted: the request needs {wanted} pages, {self.num_unreserved_pages} of "
                f"{self.num_pages} are free; retry when running requests finish"
            )
        self._seqs[seq_id] = alloc
        self._promised += need
        self._attach(alloc, hits)
        return hits

    def reuse_cached(self, seq_id: str, num_computed: int, need_payload: bool = False) -> list[CachedPage]:
        """Before prefilling on from `num_computed` tokens: the cached pages that continue the table
        now (another request may have committed them since this one arrived), joined to it."""
        alloc = self._seqs[seq_id]
        if num_computed != len(alloc.table) * self.page_size:
            return []  # mid-page: the next page is this sequence's own
        hits = self._match(alloc, need_payload)
        self._attach(alloc, hits)
        return hits

    def publish(
        self, seq_id: str, num_computed: int, payload_of: Callable[[int], object] | None = None
    ) -> int:
        """Offer the prompt pages that `num_computed` committed tokens fill to the cache; returns how
        many pages became settled. `payload_of(i)` is the payload of the i-th of them."""
        alloc = self._seqs[seq_id]
        if self.index is None:
            return 0
        start, end = alloc.settled, min(num_computed // self.page_size, len(alloc.hashes))
        size = self.page_size
        for k in range(start, end):
            entry = CachedPage(
                page=alloc.table[k],
                hash=alloc.hashes[k],
                parent=alloc.hashes[k - 1] if k else ROOT,
                tokens=tuple(alloc.prompt[k * size : (k + 1) * size]),
                depth=k,
                payload=payload_of(k - start) if payload_of is not None else None,
                last_used=self._tick(),
            )
            self.index.add(entry)  # refused when the same tokens are cached already: it stays private
        alloc.settled = max(start, end)
        return max(0, end - start)

    def ensure(self, seq_id: str, num_tokens: int) -> list[int]:
        """Grow the sequence's table to hold `num_tokens`; never beyond its reservation."""
        alloc = self._seqs[seq_id]
        need = pages_for(num_tokens, self.page_size)
        if need > alloc.reserved:
            raise RuntimeError(
                f"sequence {seq_id} asked for {need} pages beyond its reservation {alloc.reserved}"
            )
        grow = need - len(alloc.table)
        if grow <= 0:
            return alloc.table
        if grow <= len(self._free):  # free pages enough: no eviction, taken in one pass (most calls)
            take, refs = self._free.popleft, self._refs
            for _ in range(grow):
                page = take()
                refs[page] = 1
                alloc.table.append(page)
        else:
            for _ in range(grow):
                alloc.table.append(self._take())
        self._promised -= grow
        return alloc.table

    def truncate(self, seq_id: str, num_tokens: int) -> None:
        """Roll back to `num_tokens` valid tokens, returning whole pages past them to the pool."""
        alloc = self._seqs[seq_id]
        keep = pages_for(num_tokens, self.page_size)
        cut = len(alloc.table) - keep
        if cut > 0:
            self._drop_all(reversed(alloc.table[keep:]))  # the last page first, as popping them would
            del alloc.table[keep:]
            self._promised += cut
        alloc.settled = min(alloc.settled, len(alloc.table))

    def release(self, seq_id: str) -> None:
        alloc = self._seqs.pop(seq_id, None)
        if alloc is not None:
            self._promised -= alloc.reserved - len(alloc.table)
            # Last page first: of a prompt's cached pages, the later ones are evicted before the
            # earlier ones, which more prompts share.
            self._drop_all(reversed(alloc.table))

    def table(self, seq_id: str) -> list[int]:
        return self._seqs[seq_id].table

    def clear_cache(self) -> None:
        """Forget every cached page (their K/V are about to be overwritten, e.g. by profiling)."""
        if self.index is None:
            return
        self.index.clear()
        self._free.extend(self._evictable)
        self._evictable.clear()

    def routing_summary(self) -> dict:
        """What a router reads to predict the prefill this replica would skip for a prompt
        (dspark.prefix_cache.cached_prefix_tokens): the short hashes of the most recently used
        cached pages among the first pages of prompts. Built again only once a page was cached, dropped
        or used since the last one (the replica reads it every routing-stats period, mostly unchanged);
        callers must not change it."""
        if self.index is None:
            return {"enabled": False}
        at = (self.index.version, self._clock)
        if self._summary is not None and self._summary[0] == at:
            return self._summary[1]
        shallow = (e for e in self.index.entries() if e.depth < ROUTE_MAX_DEPTH)
        recent = heapq.nlargest(ROUTE_MAX_HASHES, shallow, key=lambda e: e.last_used)
        summary = {
            "enabled": True,
            "page_size": self.page_size,
            "cached_pages": len(self.index),
            "hashes": [route_hash(e.hash) for e in recent],
        }
        self._summary = (at, summary)
        return summary

    # ---- pages ----------------------------------------------------------------------------------

    def _match(self, alloc: _Allocation, need_payload: bool) -> list[CachedPage]:
        """The cached pages that continue `alloc`'s table along its prompt. Never the page of the last
        prompt token: that token must run through the target, which writes its page."""
        if self.index is None or len(alloc.table) != alloc.settled:
            return []
        size = self.page_size
        limit = min(len(alloc.hashes), (len(alloc.prompt) - 1) // size)
        hits: list[CachedPage] = []
        parent = alloc.hashes[alloc.settled - 1] if alloc.settled else ROOT
        for k in range(alloc.settled, limit):
            entry = self.index.lookup(alloc.hashes[k], parent, alloc.prompt[k * size : (k + 1) * size])
            if entry is None or (need_payload and entry.payload is None):
                break
            hits.append(entry)
            parent = entry.hash
        return hits

    def _attach(self, alloc: _Allocation, hits: list[CachedPage]) -> None:
        for entry in hits:
            if self._refs[entry.page] == 0:
                del self._evictable[entry.page]
            self._refs[entry.page] += 1
            entry.last_used = self._tick()
            alloc.table.append(entry.page)
        alloc.settled += len(hits)
        self._promised -= len(hits)

    def _take(self) -> int:
        """A page for one sequence alone: a free one, else the least recently used cached one no one holds."""
        if self._free:
            page = self._free.popleft()
        else:
            page, _ = self._evictable.popitem(last=False)
            self.index.remove(page)
            self.evictions += 1
        self._refs[page] = 1
        return page

    def _drop_all(self, pages: Iterable[int]) -> None:
        """Let go of each page in turn: one no one holds any more is evictable while it caches a prompt
        page, else free. One loop for all of them (a finished request returns dozens at once)."""
        refs, free, evictable, index = self._refs, self._free, self._evictable, self.index
        for page in pages:
            refs[page] -= 1
            if refs[page] == 0:
                if index is not None and page in index:
                    evictable[page] = None
                else:
                    free.append(page)

    def _tick(self) -> int:
        self._clock += 1
        return self._clock


class KVCache:
    """The K/V tensors: one [slots, kv_heads, head_dim] pair per layer, slots = pages x page_size."""

    def __init__(
        self,
        num_layers: int,
        num_pages: int,
        page_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
    ) -> None:
        self.num_pages = num_pages
        shape = (num_pages * page_size, num_kv_heads, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]

    @staticmethod
    def bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        return 2 * num_layers * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()
