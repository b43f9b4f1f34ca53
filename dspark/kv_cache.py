"""Paged KV cache: fixed-size blocks, per-sequence block tables, reservation-based admission, rollback.

A request reserves, at admission, the blocks its longest possible life needs (prompt + max_tokens), so
the cache can never run out under a running request: exhaustion is always a refusal of the newcomer.
Blocks are still handed out lazily, so an early stop returns what was never used.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import torch

from dspark.errors import AdmissionError


def blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


@dataclass
class _Allocation:
    reserved: int  # blocks this sequence may ever hold
    table: list[int] = field(default_factory=list)


class BlockManager:
    """Pure accounting of KV pages; knows nothing about tensors."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks, self.block_size = num_blocks, block_size
        self._free: deque[int] = deque(range(num_blocks))
        self._seqs: dict[str, _Allocation] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_unreserved_blocks(self) -> int:
        """Blocks neither held nor promised to a running sequence: the admission headroom."""
        promised = sum(a.reserved - len(a.table) for a in self._seqs.values())
        return len(self._free) - promised

    def reserve(self, seq_id: str, max_tokens: int) -> None:
        need = blocks_for(max_tokens, self.block_size)
        if need > self.num_blocks:
            raise AdmissionError(
                f"KV cache too small: the request needs {need} blocks of {self.block_size} tokens "
                f"({max_tokens} tokens) but the cache has {self.num_blocks} in total",
                retry_after_s=0.0,
            )
        if need > self.num_unreserved_blocks:
            raise AdmissionError(
                f"KV cache exhausted: the request needs {need} blocks, {self.num_unreserved_blocks} of "
                f"{self.num_blocks} are free; retry when running requests finish"
            )
        self._seqs[seq_id] = _Allocation(reserved=need)

    def ensure(self, seq_id: str, num_tokens: int) -> list[int]:
        """Grow the sequence's table to hold `num_tokens`; never beyond its reservation."""
        alloc = self._seqs[seq_id]
        need = blocks_for(num_tokens, self.block_size)
        if need > alloc.reserved:
            raise RuntimeError(
                f"sequence {seq_id} asked for {need} blocks beyond its reservation {alloc.reserved}"
            )
        while len(alloc.table) < need:
            alloc.table.append(self._free.popleft())
        return alloc.table

    def truncate(self, seq_id: str, num_tokens: int) -> None:
        """Roll back to `num_tokens` valid tokens, returning whole blocks past them to the pool."""
        alloc = self._seqs[seq_id]
        keep = blocks_for(num_tokens, self.block_size)
        while len(alloc.table) > keep:
            self._free.append(alloc.table.pop())

    def release(self, seq_id: str) -> None:
        alloc = self._seqs.pop(seq_id, None)
        if alloc is not None:
            self._free.extend(alloc.table)

    def table(self, seq_id: str) -> list[int]:
        return self._seqs[seq_id].table


class KVCache:
    """The K/V tensors: one [slots, kv_heads, head_dim] pair per layer, slots = blocks x block_size."""

    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
    ) -> None:
        shape = (num_blocks * block_size, num_kv_heads, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]

    @staticmethod
    def bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        return 2 * num_layers * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()
