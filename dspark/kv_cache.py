"""Paged KV cache: fixed-size pages, per-sequence page tables, reservation-based admission, rollback.

A request reserves, at admission, the pages its longest possible life needs (prompt + max_tokens), so
the cache can never run out under a running request: exhaustion is always a refusal of the newcomer.
Blocks are still handed out lazily, so an early stop returns what was never used.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import torch

from dspark.errors import AdmissionError


def pages_for(num_tokens: int, page_size: int) -> int:
    return -(-num_tokens // page_size)


@dataclass
class _Allocation:
    reserved: int  # pages this sequence may ever hold
    table: list[int] = field(default_factory=list)


class PageManager:
    """Pure accounting of KV pages; knows nothing about tensors."""

    def __init__(self, num_pages: int, page_size: int) -> None:
        self.num_pages, self.page_size = num_pages, page_size
        self._free: deque[int] = deque(range(num_pages))
        self._seqs: dict[str, _Allocation] = {}

    @property
    def num_free_pages(self) -> int:
        return len(self._free)

    @property
    def num_unreserved_pages(self) -> int:
        """Blocks neither held nor promised to a running sequence: the admission headroom."""
        promised = sum(a.reserved - len(a.table) for a in self._seqs.values())
        return len(self._free) - promised

    def reserve(self, seq_id: str, max_tokens: int) -> None:
        need = pages_for(max_tokens, self.page_size)
        if need > self.num_pages:
            raise AdmissionError(
                f"KV cache too small: the request needs {need} pages of {self.page_size} tokens "
                f"({max_tokens} tokens) but the cache has {self.num_pages} in total",
                retry_after_s=0.0,
            )
        if need > self.num_unreserved_pages:
            raise AdmissionError(
                f"KV cache exhausted: the request needs {need} pages, {self.num_unreserved_pages} of "
                f"{self.num_pages} are free; retry when running requests finish"
            )
        self._seqs[seq_id] = _Allocation(reserved=need)

    def ensure(self, seq_id: str, num_tokens: int) -> list[int]:
        """Grow the sequence's table to hold `num_tokens`; never beyond its reservation."""
        alloc = self._seqs[seq_id]
        need = pages_for(num_tokens, self.page_size)
        if need > alloc.reserved:
            raise RuntimeError(
                f"sequence {seq_id} asked for {need} pages beyond its reservation {alloc.reserved}"
            )
        while len(alloc.table) < need:
            alloc.table.append(self._free.popleft())
        return alloc.table

    def truncate(self, seq_id: str, num_tokens: int) -> None:
        """Roll back to `num_tokens` valid tokens, returning whole pages past them to the pool."""
        alloc = self._seqs[seq_id]
        keep = pages_for(num_tokens, self.page_size)
        while len(alloc.table) > keep:
            self._free.append(alloc.table.pop())

    def release(self, seq_id: str) -> None:
        alloc = self._seqs.pop(seq_id, None)
        if alloc is not None:
            self._free.extend(alloc.table)

    def table(self, seq_id: str) -> list[int]:
        return self._seqs[seq_id].table


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
