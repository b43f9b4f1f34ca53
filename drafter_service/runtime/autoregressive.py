"""An autoregressive drafter (EAGLE-3 chain, MTP-1) serving inside the engine.

Per request it keeps the fused target features of committed positions and the K/V of every committed
entry; each round it runs `num_slots` chain steps for all requests together, one token per step,
each step's q shaped like the target's p.

It runs in the engine's dtype on its device: weights, cached features and K/V and every index tensor
live there; logits and q are fp32, and proposals reach the engine on the CPU (dspark/drafter.py).
"""

from __future__ import annotations

import torch

from drafter_service.models.layers import pad_rows
from drafter_service.models.paths import open_drafter
from drafter_service.runtime.host import to_host
from dspark.drafter import DraftProposal, DraftRequest
from dspark.sampling import sample_rows


class ARDraftRuntime:
    def __init__(
        self,
        target,
        num_speculative_tokens: int = 7,
        path: str | None = None,
        target_path: str | None = None,
        name: str = "eagle3",
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
        **_: object,
    ) -> None:
        self.model = open_drafter(name, path, target_path, target, dtype, device)
        self.device = self.model.device
        cfg = self.model.cfg
        self.name = cfg.kind
        self.target_layer_ids = tuple(cfg.target_layer_ids)
        self.max_draft_tokens = min(cfg.draft_length, num_speculative_tokens)
        self.reports_confidence = False  # chain drafters have no confidence head
        self._features: dict[str, torch.Tensor] = {}  # g_t of committed positions
        self._kv: dict[str, list[torch.Tensor]] = {}  # K/V of entries 0 .. n-1, final once written
        self._pending: dict[str, list[torch.Tensor]] = {}  # hidden states not yet fused

    def add_context(self, seq_id: str, token_ids: list[int], hidden: torch.Tensor | None) -> None:
        # Queued; fused into features when the next proposal needs them (cheap rounds when gated).
        self._pending.setdefault(seq_id, []).append(hidden)

    def _features_of(self, seq_id: str) -> torch.Tensor:
        pending = self._pending.pop(seq_id, None)
        if pending:
            g = self.model.target_features(torch.cat(pending))
            old = self._features.get(seq_id)
            self._features[seq_id] = g if old is None else torch.cat([old, g])
        return self._features[seq_id]

    def _extend_cache(self, r: DraftRequest) -> None:
        """Entries t pair g_t with x_{t+1}: once the anchor is known, every committed entry is final."""
        feats = self._features[r.seq_id]
        kv = self._kv.setdefault(
            r.seq_id, [feats.new_zeros(0, self.model.cfg.num_key_value_heads, self.model.cfg.head_dim)] * 2
        )
        start, end = len(kv[0]), len(feats)
        if start < end:
            next_tokens = torch.tensor(r.token_ids[start + 1 : end + 1], device=self.device)
            x, _ = self.model.entry(next_tokens, feats[start:end])
            k, v = self.model.entry_kv(x[None], torch.arange(start, end, device=self.device)[None])
            kv[0], kv[1] = torch.cat([kv[0], k[0]]), torch.cat([kv[1], v[0]])

    @torch.inference_mode()
    def propose(self, requests: list[DraftRequest]) -> list[DraftProposal]:
        model = self.model
        for r in requests:
            if len(self._features_of(r.seq_id)) != len(r.token_ids) - 1:
                raise RuntimeError(f"drafter context of {r.seq_id} is out of step with the engine")
            self._extend_cache(r)
        num, dev = len(requests), self.device
        s = torch.tensor([len(r.token_ids) - 1 for r in requests], device=dev)  # anchor positions
        # The chain starts from the last committed entry (s - 1), whose output predicts x_{s+1}.
        extra_k = pad_rows([self._kv[r.seq_id][0][:-1] for r in requests], int(s.max()) - 1)
        extra_v = pad_rows([self._kv[r.seq_id][1][:-1] for r in requests], int(s.max()) - 1)
        valid = torch.arange(extra_k.shape[1], device=dev)[None, :] < (s - 1)[:, None]
        column = torch.ones(num, 1, dtype=torch.bool, device=dev)
        last = torch.stack([self._features[r.seq_id][-1] for r in requests])
        x, residual = model.entry(torch.tensor([r.token_ids[-1] for r in requests], device=dev), last)
        x, residual, positions = x[:, None], residual[:, None], (s - 1)[:, None]
        steps = max(r.num_slots for r in requests)
        drawn_steps = []  # per step, [R] tokens on the device (finished chains repeat their argmax)
        rows = [[] for _ in requests]
        for i in range(steps):
            mask = torch.cat([valid, column], -1)[:, None]
            h = model.step(x, residual, positions, extra_k, extra_v, mask)
            logits = model.logits(h)[:, 0]
            # Requests whose chain is complete keep stepping (batched) but draw nothing more.
            active = [j for j, r in enumerate(requests) if i < r.num_slots]
            drawn, q = sample_rows(
                logits[active], [requests[j].params for j in active], [requests[j].generator for j in active]
            )
            nxt = torch.argmax(logits, dim=-1)
            nxt[active] = drawn
            drawn_steps.append(nxt)
            for j, q_row in zip(active, q):
                if q_row is not None:
                    rows[j].append(q_row)
            if i + 1 == steps:
                break
            # This step's entry joins the keys; the next entry pairs its output h with the drafted token.
            k, v = model.entry_kv(x, positions)
            extra_k, extra_v = torch.cat([extra_k, k], 1), torch.cat([extra_v, v], 1)
            valid = torch.cat([valid, column], -1)
            x, residual = model.entry(nxt[:, None], h)
            positions = positions + 1
        # One device-to-host copy each for the round's tokens and its q rows.
        token_lists = torch.stack(drawn_steps, 1).tolist()
        sampled = [j for j, q in enumerate(rows) if q]
        q_of = dict(zip(sampled, to_host([torch.stack(rows[j]) for j in sampled])))
        return [
            DraftProposal(token_lists[j][: r.num_slots], probs=q_of.get(j)) for j, r in enumerate(requests)
        ]

    def release(self, seq_id: str) -> None:
        self._features.pop(seq_id, None)
        self._kv.pop(seq_id, None)
        self._pending.pop(seq_id, None)
