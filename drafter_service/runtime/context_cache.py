"""The drafter's K/V of every request's context, in preallocated pools rather than per-request tensors.

Per draft layer one key pool and one value pool [slots, Hkv, capacity, Dh]; each running request owns
one slot (a row) and its context position p lives at column p. Writing a round's new positions is one
indexed copy per layer for all requests, with no per-request concatenation; both dimensions grow by
doubling, so reallocation is rare. Columns past a request's length are free scratch: the block pass
writes its own slots' K/V there and attends to the row as it is (models/block.py `run_block_into`).

Reading a batch is a view when the requests' slots are consecutive (a single request always, a
batch usually: slots are handed out lowest first), else one gather per layer.
"""

from __future__ import annotations

import heapq

import torch


class ContextCache:
    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
        slots: int = 4,
        capacity: int = 256,
    ) -> None:
        shape = (slots, num_kv_heads, capacity, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.slot_of: dict[str, int] = {}
        self._free = list(range(slots))  # a heap: the lowest free slot first

    @property
    def capacity(self) -> int:
        return self.k[0].shape[2]

    def slot(self, seq_id: str) -> int:
        """This request's row, handed out on first use."""
        slot = self.slot_of.get(seq_id)
        if slot is None:
            if not self._free:
                self._grow(slots=2 * self.k[0].shape[0])
            slot = self.slot_of[seq_id] = heapq.heappop(self._free)
        return slot

    def release(self, seq_id: str) -> None:
        slot = self.slot_of.pop(seq_id, None)
        if slot is not None:
            heapq.heappush(self._free, slot)

    def reserve(self, length: int) -> None:
        """Make room for columns 0 .. length - 1 in every row."""
        if length > self.capacity:
            capacity = self.capacity
            while capacity < length:
                capacity *= 2
            self._grow(capacity=capacity)

    def write(
        self, layer: int, slots: torch.Tensor, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ):
        """K/V [N, Hkv, Dh] of N (slot, position) pairs into the layer's pools."""
        self.k[layer][slots, :, positions] = k
        self.v[layer][slots, :, positions] = v

    def rows(self, layer: int, slots: list[int], length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values [R, Hkv, length, Dh] of these slots' first `length` columns, in this order."""
        first = slots[0]
        if slots == list(range(first, first + len(slots))):
            return self.k[layer][first : first + len(slots), :, :length], self.v[layer][
                first : first + len(slots), :, :length
            ]
        index = torch.tensor(slots, device=self.k[layer].device)
        return self.k[layer][index, :, :length], self.v[layer][index, :, :length]

    def _grow(self, slots: int | None = None, capacity: int | None = None) -> None:
        old_slots, heads, old_capacity, dim = self.k[0].shape
        slots, capacity = slots or old_slots, capacity or old_capacity
        for pools in (self.k, self.v):
            for i, old in enumerate(pools):
                new = old.new_zeros(slots, heads, capacity, dim)
                new[:old_slots, :, :old_capacity] = old
                pools[i] = new
        for slot in range(old_slots, slots):
            heapq.heappush(self._free, slot)
