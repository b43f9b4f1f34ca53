"""ModelRunner: turns a list of per-request token slices into one flattened forward over the KV cache."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dspark.attention import AttentionBatch, SeqSlice
from dspark.kv_cache import KVCache
from dspark.model import CausalLM


@dataclass
class ForwardItem:
    """One request's tokens this step: they sit at positions start, start + 1, ..."""

    token_ids: list[int]
    start: int
    page_table: list[int]
    logits_from: int  # logits are wanted for token_ids[logits_from:]


@dataclass
class ForwardResult:
    logits: list[torch.Tensor]  # per item, [len(token_ids) - logits_from, V] in fp32
    hidden: list[torch.Tensor | None]  # per item, the tapped layers concatenated [len(token_ids), k * d]


class ModelRunner:
    def __init__(
        self, model: CausalLM, kv: KVCache, page_size: int, device: torch.device | str = "cpu"
    ) -> None:
        self.model, self.kv, self.page_size, self.device = model, kv, page_size, torch.device(device)

    @torch.inference_mode()
    def forward(self, items: list[ForwardItem], tap_layers: tuple[int, ...] = ()) -> ForwardResult:
        ids = torch.tensor([t for it in items for t in it.token_ids], device=self.device)
        positions = torch.tensor(
            [it.start + i for it in items for i in range(len(it.token_ids))], device=self.device
        )
        slices = [SeqSlice(it.page_table, it.start, len(it.token_ids)) for it in items]
        batch = AttentionBatch.build(slices, self.page_size, self.device)
        hidden, taps = self.model(ids, positions, batch, self.kv.k, self.kv.v, tap_layers)
        offsets = [0]
        for it in items:
            offsets.append(offsets[-1] + len(it.token_ids))
        rows = torch.tensor(
            [offsets[i] + j for i, it in enumerate(items) for j in range(it.logits_from, len(it.token_ids))],
            dtype=torch.long,
            device=self.device,
        )
        logits = self.model.logits(hidden[rows]).cpu() if len(rows) else torch.empty(0)
        per_item_logits, cursor = [], 0
        for it in items:
            n = len(it.token_ids) - it.logits_from
            per_item_logits.append(logits[cursor : cursor + n])
            cursor += n
        tapped = torch.cat([taps[layer] for layer in tap_layers], dim=-1) if tap_layers else None
        per_item_hidden = [
            tapped[offsets[i] : offsets[i + 1]] if tapped is not None else None for i in range(len(items))
        ]
        return ForwardResult(per_item_logits, per_item_hidden)
