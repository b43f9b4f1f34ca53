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

from drafter_service.models.block import BlockDrafter
from drafter_service.models.paths import open_drafter
from drafter_service.runtime.context_cache import ContextCache
from drafter_service.runtime.host import to_host
from drafter_service.runtime.vocab_heads import VocabHeads, compute_dtype, head_dtype
from dspark.block_sampler import BlockSampler
from dspark.drafter import DraftProposal, DraftRequest
from dspark.errors import ModelLoadError


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
        head_dtype: str = "auto",
        compute_dtype: str = "auto",
        **_: object,
    ) -> None:
        """`head_dtype`: the LM head's ("auto": bf16 where the device multiplies it natively;
        "float32"; "bfloat16"); `compute_dtype`: the draft layers' ("auto": bf16 for an fp32 drafter
        where bf16 is native), see runtime/vocab_heads.py. Either way q and the confidences are fp32 and
        q is exactly what each token was drawn from: the dtype moves acceptance, never the output."""
        model = open_drafter(name, path, target_path, target, dtype, device)
        self._serve(model, num_speculative_tokens, head_dtype, compute_dtype)

    @classmethod
    def of(
        cls,
        model: BlockDrafter,
        num_speculative_tokens: int = 7,
        head_dtype: str = "auto",
        compute_dtype: str | None = None,
    ) -> BlockDraftRuntime:
        """Serve a drafter already in memory (no checkpoint to open); None: compute in its own dtype."""
        runtime = cls.__new__(cls)
        runtime._serve(model, num_speculative_tokens, head_dtype, compute_dtype)
        return runtime

    def _serve(
        self, model: BlockDrafter, num_speculative_tokens: int, head: str, compute: str | None
    ) -> None:
        if compute is not None:
            model = model.cast_weights(compute_dtype(compute, model.dtype, model.device))
        self.model = model
        self.device = model.device
        self.heads = VocabHeads(model, head_dtype(head, model.dtype, model.device))
        cfg = model.cfg
        name = self.name = cfg.kind
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
        self.cache = ContextCache(
            len(self.model.layers), cfg.num_key_value_heads, cfg.head_dim, self.model.dtype, self.device
        )
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
        slots, positions = [], []
        for s, r in zip(todo, rows):
            slots += [self.cache.slot(s)] * len(r)
            positions += range(self._len[s] - len(r), self._len[s])
        # Room for the context and, after it, the scratch columns of the next block (run_block_into).
        self.cache.reserve(max(self._len[s] for s in todo) + self.block_size)
        positions_t = torch.tensor(positions, device=self.device)
        slots_t = torch.tensor(slots, device=self.device)
        kv = self.model.context_kv(self.model.context_features(torch.cat(rows)[None]), positions_t[None])
        for layer, (k, v) in enumerate(kv):
            self.cache.write(layer, slots_t, positions_t, k[0], v[0])

    @torch.inference_mode()
    def propose(self, requests: list[DraftRequest]) -> list[DraftProposal]:
        model, gamma, dev = self.model, self.block_size, self.device
        for r in requests:
            if self._len.get(r.seq_id) != len(r.token_ids) - 1:
                raise RuntimeError(
                    f"drafter context of {r.seq_id} holds {self._len.get(r.seq_id, 0)} positions, "
                    f"expected {len(r.token_ids) - 1}"
                )
        self._flush([r.seq_id for r in requests])
        # In slot order, so the batch reads the cache as a view when the slots are consecutive.
        order = sorted(range(len(requests)), key=lambda i: self.cache.slot(requests[i].seq_id))
        batch = [requests[i] for i in order]
        slots = [self.cache.slot(r.seq_id) for r in batch]
        lengths = [self._len[r.seq_id] for r in batch]
        num, width = len(batch), max(lengths) + gamma
        self.cache.reserve(width)
        anchors = torch.tensor([r.token_ids[-1] for r in batch], device=dev)
        tokens = torch.full((num, gamma), model.cfg.mask_token_id, dtype=torch.long, device=dev)
        tokens[:, 0] = anchors
        starts = torch.tensor(lengths, device=dev)
        positions = starts[:, None] + torch.arange(gamma, device=dev)[None]
        # Each block's own K/V go into the scratch columns right after its context: every row then
        # holds [context ; block] and attends to its first length + gamma columns.
        write_slots = torch.tensor(slots, device=dev).repeat_interleave(gamma)
        write_positions = positions.reshape(-1)
        mask = None
        if min(lengths) != max(lengths):
            mask = (torch.arange(width, device=dev)[None, :] < (starts + gamma)[:, None])[:, None, :]

        def keys_with(layer: int):
            def merge(k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
                self.cache.write(layer, write_slots, write_positions, k.flatten(0, 1), v.flatten(0, 1))
                return self.cache.rows(layer, slots, width)

            return merge

        h = model.run_block_into(tokens, positions, [keys_with(i) for i in range(len(model.layers))], mask)
        base = self.heads.base_logits(h)  # [R, gamma, V] fp32
        proposals = self._walk(batch, h, base, anchors)
        in_order: list[DraftProposal] = [None] * len(requests)  # type: ignore[list-item]
        for i, proposal in zip(order, proposals):
            in_order[i] = proposal
        return in_order

    def _walk(
        self, requests: list[DraftRequest], h: torch.Tensor, base: torch.Tensor, anchors: torch.Tensor
    ) -> list[DraftProposal]:
        """Left to right through the Markov head, all requests at once: each slot conditions on the
        token chosen just before it, and its q is exactly what that token was drawn from."""
        model, head = self.model, self.model.markov_head
        num_slots = [r.num_slots for r in requests]
        sampler = BlockSampler(
            [r.params for r in requests], [r.generator for r in requests], num_slots, self.device
        )
        steps = sampler.steps
        drawn = torch.empty(len(requests), steps, dtype=torch.long, device=self.device)
        prev, state, z = anchors, None if head is None else head.initial_state(h[:, 0]), None
        for k in range(steps):
            if head is not None:
                z, state = head.step(prev, h[:, k], state)
            prev = drawn[:, k] = sampler.draw(self.heads.with_markov(base[:, k], z), k)
        # Host copies of the whole round at once: tokens, then q rows and confidences in one transfer.
        token_lists = drawn.tolist()
        groups = sampler.probs()
        host = to_host([q for _, q in groups] + self._confidences(requests, h, anchors, drawn))
        q_of = {i: q[j] for (rows, _), q in zip(groups, host) for j, i in enumerate(rows)}
        raws = confidences = [None] * len(requests)
        if model.cfg.enable_confidence_head:
            raws, confidences = host[len(groups) :]
        return [
            DraftProposal(
                token_lists[i][:n],
                probs=None if i not in q_of else q_of[i][:n],
                confidence=None if confidences[i] is None else confidences[i][:n],
                confidence_logits=None if raws[i] is None else raws[i][:n],
            )
            for i, n in enumerate(num_slots)
        ]

    def _confidences(
        self, requests: list[DraftRequest], h: torch.Tensor, anchors: torch.Tensor, drawn: torch.Tensor
    ) -> list[torch.Tensor]:
        """[raw logits, STS-calibrated confidences], each [R, steps]; [] without a confidence head."""
        if not self.model.cfg.enable_confidence_head:
            return []
        steps = drawn.shape[1]
        previous = torch.cat([anchors[:, None], drawn[:, :-1]], dim=1)  # the token before each slot
        raw = self.model.confidence_logit(h[:, :steps], previous)  # [R, steps] fp32
        temps = {}
        for r in requests:
            t = r.params.temperature
            if t not in temps:
                temps[t] = self.sts_temperatures(t)[:steps]
        scale = torch.stack([temps[r.params.temperature] for r in requests])
        return [raw, torch.sigmoid(raw / scale)]

    def sts_temperatures(self, sampling_temperature: float) -> torch.Tensor:
        """The STS temperatures fitted at the serving temperature nearest this request's (ones if none)."""
        if not self.calibration:
            return torch.ones(self.block_size, device=self.device)
        nearest = min(self.calibration, key=lambda t: abs(t - sampling_temperature))
        return self.calibration[nearest]

    def release(self, seq_id: str) -> None:
        self.cache.release(seq_id)
        self._len.pop(seq_id, None)
        self._pending.pop(seq_id, None)
