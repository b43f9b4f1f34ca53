"""A block drafter (DSpark or DFlash) serving inside the engine, behind dspark's Drafter protocol.

Per request it caches the draft layers' K/V of the context features of every committed position; each
round it runs one block pass for all requests together, then walks the Markov head left to right,
sampling each slot from q_k = softmax((U_k + B_k) / T) shaped like the target's p, where the Markov
term B_k depends on the token drawn just before (models/markov.py).

It runs in the engine's dtype on its device: weights, cached K/V and every index tensor live there;
logits, q and confidences are fp32, and proposals reach the engine on the CPU (dspark/drafter.py).
"""

from __future__ import annotations

import torch

from drafter_service.models.layers import pad_rows
from drafter_service.models.paths import open_drafter
from drafter_service.runtime.host import to_host
from dspark.drafter import DraftProposal, DraftRequest
from dspark.errors import ModelLoadError
from dspark.sampling import sample_rows


class BlockDraftRuntime:
    def __init__(
        self,
        target,
        num_speculative_tokens: int = 7,
        path: str | None = None,
        target_path: str | None = None,
        name: str = "dspark",
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
        **_: object,
    ) -> None:
        self.model = open_drafter(name, path, target_path, target, dtype, device)
        self.device = self.model.device
        cfg = self.model.cfg
        self.name = cfg.kind
        self.target_layer_ids = tuple(cfg.target_layer_ids)
        self.block_size = cfg.block_size
        # DFlash has no confidence head: the load-aware scheduler then need not profile for it.
        self.reports_confidence = cfg.enable_confidence_head
        self.max_draft_tokens = min(cfg.block_size, num_speculative_tokens)
        for t, temps in cfg.sts_temperatures.items():
            if len(temps) != cfg.block_size:
                raise ModelLoadError(
                    f"drafter {name!r}: the STS temperatures for serving temperature {t} hold {len(temps)} "
                    f"values, block_size is {cfg.block_size}"
                )
        self.calibration = {
            float(t): torch.tensor(v, dtype=torch.float32, device=self.device)
            for t, v in cfg.sts_temperatures.items()
        }
        self._ctx: dict[str, list[list[torch.Tensor]]] = {}  # seq -> [per layer [k, v]]
        self._len: dict[str, int] = {}
        self._pending: dict[str, list[torch.Tensor]] = {}  # hidden states not yet in the K/V cache

    def add_context(self, seq_id: str, token_ids: list[int], hidden: torch.Tensor | None) -> None:
        # Only queued here: the context K/V are computed for all requests at once when the next
        # proposal needs them, so rounds that do not draft (the draft gate) cost almost nothing.
        self._pending.setdefault(seq_id, []).append(hidden)
        self._len[seq_id] = self._len.get(seq_id, 0) + len(token_ids)

    def _flush(self, seq_ids: list[str]) -> None:
        """Fold the queued hidden states of these requests into their context K/V, in one pass."""
        todo = [s for s in seq_ids if self._pending.get(s)]
        if not todo:
            return
        rows = [torch.cat(self._pending.pop(s)) for s in todo]
        positions = torch.tensor(
            [p for s, r in zip(todo, rows) for p in range(self._len[s] - len(r), self._len[s])],
            device=self.device,
        )
        kv = self.model.context_kv(self.model.context_features(torch.cat(rows)[None]), positions[None])
        offset = 0
        for s, r in zip(todo, rows):
            part = slice(offset, offset + len(r))
            offset += len(r)
            cache = self._ctx.get(s)
            if cache is None:
                self._ctx[s] = [[k[0, part], v[0, part]] for k, v in kv]
            else:
                for entry, (k, v) in zip(cache, kv):
                    entry[0] = torch.cat([entry[0], k[0, part]])
                    entry[1] = torch.cat([entry[1], v[0, part]])

    @torch.inference_mode()
    def propose(self, requests: list[DraftRequest]) -> list[DraftProposal]:
        model, gamma = self.model, self.block_size
        lengths = [self._len[r.seq_id] for r in requests]
        for r, n in zip(requests, lengths):
            if n != len(r.token_ids) - 1:
                raise RuntimeError(
                    f"drafter context of {r.seq_id} holds {n} positions, expected {len(r.token_ids) - 1}"
                )
        self._flush([r.seq_id for r in requests])
        num, k_max = len(requests), max(lengths)
        context = []
        for layer in range(len(model.layers)):
            ks = [self._ctx[r.seq_id][layer][0] for r in requests]
            vs = [self._ctx[r.seq_id][layer][1] for r in requests]
            context.append((pad_rows(ks, k_max), pad_rows(vs, k_max)))
        dev = self.device
        anchors = torch.tensor([r.token_ids[-1] for r in requests], device=dev)
        tokens = torch.full((num, gamma), model.cfg.mask_token_id, dtype=torch.long, device=dev)
        tokens[:, 0] = anchors
        starts = torch.tensor(lengths, device=dev)
        positions = starts[:, None] + torch.arange(gamma, device=dev)[None]
        visible_ctx = torch.arange(k_max, device=dev)[None, None, :] < starts[:, None, None]
        mask = torch.cat(
            [
                visible_ctx.expand(num, gamma, k_max),
                torch.ones(num, gamma, gamma, dtype=torch.bool, device=dev),
            ],
            -1,
        )
        h = model.run_block(tokens, positions, context, mask)
        base = model.base_logits(h)  # [R, gamma, V]
        return self._walk(requests, h, base, anchors)

    def _walk(
        self, requests: list[DraftRequest], h: torch.Tensor, base: torch.Tensor, anchors: torch.Tensor
    ) -> list[DraftProposal]:
        """Left to right through the Markov head, all requests at once: each slot conditions on the
        token chosen just before it, and its q is exactly what that token was drawn from."""
        model = self.model
        steps = max(r.num_slots for r in requests)
        prev, state = anchors, None
        tokens, rows, conf = [], [], []
        for k in range(steps):
            bias, state = model.markov_step(prev, h[:, k], state)
            logits = base[:, k] + bias
            if model.cfg.enable_confidence_head:
                conf.append(model.confidence_logit(h[:, k], prev))
            active = [i for i, r in enumerate(requests) if k < r.num_slots]
            drawn, q = sample_rows(
                logits[active], [requests[i].params for i in active], [requests[i].generator for i in active]
            )
            prev = prev.clone()
            prev[active] = drawn
            tokens.append(prev)
            rows.append(dict(zip(active, q)))
        # One device-to-host copy each for tokens, q rows and confidences of the whole round.
        token_lists = torch.stack(tokens, 1).tolist()
        sampled = [i for i, r in enumerate(requests) if not r.params.greedy]
        probs = to_host([torch.stack([rows[k][i] for k in range(requests[i].num_slots)]) for i in sampled])
        q_of = dict(zip(sampled, probs))
        raws = confidences = [None] * len(requests)
        if conf:
            raw = torch.stack(conf, 1)  # [R, steps] fp32
            temps = torch.stack([self.sts_temperatures(r.params.temperature)[:steps] for r in requests])
            raws, confidences = to_host([raw, torch.sigmoid(raw / temps)])
        return [
            DraftProposal(
                token_lists[i][: r.num_slots],
                probs=q_of.get(i),
                confidence=None if confidences[i] is None else confidences[i][: r.num_slots],
                confidence_logits=None if raws[i] is None else raws[i][: r.num_slots],
            )
            for i, r in enumerate(requests)
        ]

    def sts_temperatures(self, sampling_temperature: float) -> torch.Tensor:
        """The STS temperatures fitted at the serving temperature nearest this request's (ones if none)."""
        if not self.calibration:
            return torch.ones(self.block_size, device=self.device)
        nearest = min(self.calibration, key=lambda t: abs(t - sampling_temperature))
        return self.calibration[nearest]

    def release(self, seq_id: str) -> None:
        self._ctx.pop(seq_id, None)
        self._len.pop(seq_id, None)
        self._pending.pop(seq_id, None)
