"""ContextCache: per-request rows of preallocated K/V pools that grow by doubling."""

from __future__ import annotations

import torch

from drafter_service.runtime.context_cache import ContextCache


def kv(n: int, seed: int) -> torch.Tensor:
    return torch.randn(n, 2, 3, generator=torch.Generator().manual_seed(seed))


def test_rows_read_back_what_was_written_across_growth_and_slot_reuse():
    cache = ContextCache(
        num_layers=2, num_kv_heads=2, head_dim=3, dtype=torch.float32, device="cpu", slots=1, capacity=2
    )
    assert [cache.slot(s) for s in ("a", "b", "c")] == [0, 1, 2]  # slots double from 1 to 4
    written = {}
    for seed, s in enumerate(("a", "b", "c")):
        n = 3 + seed
        cache.reserve(n)  # capacity doubles from 2 to 8
        k, v = kv(n, seed), kv(n, 10 + seed)
        slots, positions = torch.full((n,), cache.slot(s)), torch.arange(n)
        cache.write(1, slots, positions, k, v)
        written[s] = (k, v)
    assert cache.capacity == 8 and cache.k[1].shape[0] == 4
    for order in (["a", "b", "c"], ["c", "a"]):  # consecutive slots read as a view, others gathered
        keys, values = cache.rows(1, [cache.slot(s) for s in order], 3)
        for i, s in enumerate(order):
            torch.testing.assert_close(keys[i], written[s][0][:3].transpose(0, 1))
            torch.testing.assert_close(values[i], written[s][1][:3].transpose(0, 1))
    keys, _ = cache.rows(1, [0, 1], 3)
    assert keys.data_ptr() == cache.k[1].data_ptr()  # a view, not a copy
    cache.release("a")
    assert cache.slot("d") == 0  # the lowest free slot is handed out first
