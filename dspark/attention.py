"""Variable-length attention over a paged KV cache.

Every step runs one flattened forward over all requests: request b contributes `n_b` query tokens at
positions `start_b .. start_b + n_b - 1` and attends to its own cached positions `< start_b` plus
causally to its new tokens. Queries are padded into [B, Qmax] and keys gathered from the cache pages
into [B, Kmax] once per step, so each layer is one gather and one SDPA call.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class SeqSlice:
    """One request's part of a flattened batch."""

    page_table: list[int]
    start: int  # tokens already in the cache (their K/V are not recomputed)
    num_tokens: int  # new tokens this step


@dataclass
class AttentionBatch:
    slot_mapping: torch.Tensor  # [N] cache slot written by each new token
    q_index: torch.Tensor  # [B, Qmax] flat row of each padded query
    kv_slots: torch.Tensor  # [B, Kmax] cache slot of each key position
    mask: torch.Tensor | None  # [B, 1, Qmax, Kmax] True = attend; None when plain causal suffices
    out_index: torch.Tensor  # [N] row of each real query in the padded [B * Qmax] output

    @staticmethod
    def build(slices: list[SeqSlice], page_size: int, device: torch.device | str = "cpu") -> AttentionBatch:
        num_q = [s.num_tokens for s in slices]
        num_k = [s.start + s.num_tokens for s in slices]
        q_max, k_max = max(num_q), max(num_k)
        kv_slots = torch.zeros(len(slices), k_max, dtype=torch.long)
        slot_mapping, q_index, out_index = [], torch.zeros(len(slices), q_max, dtype=torch.long), []
        row = 0
        for b, s in enumerate(slices):
            pos = torch.arange(num_k[b])
            table = torch.tensor(s.page_table, dtype=torch.long)
            slots = table[pos // page_size] * page_size + pos % page_size
            kv_slots[b, : num_k[b]] = slots
            slot_mapping.append(slots[s.start :])
            q_index[b, : s.num_tokens] = torch.arange(row, row + s.num_tokens)
            out_index.append(torch.arange(b * q_max, b * q_max + s.num_tokens))
            row += s.num_tokens
        q_pos = torch.tensor([s.start for s in slices])[:, None] + torch.arange(q_max)[None, :]
        k_pos = torch.arange(k_max)
        # Key j is visible to query i when it is at or before the query's position and inside the
        # request's own context; padded query rows see key 0 only so softmax never divides by zero.
        mask = (k_pos[None, None, :] <= q_pos[:, :, None]) & (
            k_pos[None, None, :] < torch.tensor(num_k)[:, None, None]
        )
        mask[:, :, 0] = True
        return AttentionBatch(
            slot_mapping=torch.cat(slot_mapping).to(device),
            q_index=q_index.to(device),
            kv_slots=kv_slots.to(device),
            mask=mask.unsqueeze(1).to(device),
            out_index=torch.cat(out_index).to(device),
        )


def paged_attention(
    q: torch.Tensor,  # [N, H, D]
    k: torch.Tensor,  # [N, Hkv, D]
    v: torch.Tensor,
    k_cache: torch.Tensor,  # [S, Hkv, D]
    v_cache: torch.Tensor,
    batch: AttentionBatch,
) -> torch.Tensor:
    """Write the new K/V into their slots, then attend; returns [N, H * D]."""
    k_cache.index_copy_(0, batch.slot_mapping, k)
    v_cache.index_copy_(0, batch.slot_mapping, v)
    keys = k_cache[batch.kv_slots].transpose(1, 2)  # [B, Hkv, Kmax, D]
    values = v_cache[batch.kv_slots].transpose(1, 2)
    queries = q[batch.q_index].transpose(1, 2)  # [B, H, Qmax, D]
    out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=batch.mask, enable_gqa=True)
    b, h, q_max, d = out.shape
    return out.transpose(1, 2).reshape(b * q_max, h * d)[batch.out_index]
