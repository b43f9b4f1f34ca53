"""The DSpark block drafter (DSPARK.md §1-2); with Markov rank 0 and no confidence head it is DFlash.

After the target commits the anchor x0 at position s, the drafter reads [x0, MASK, ..., MASK] (gamma
slots at positions s .. s+gamma-1) in one pass: each slot attends to the fused target features of
every context position < s and to every slot of its own block. Slot j's output h_{j+1} gives base
logits U_{j+1} for the token at position s+j+1. The Markov head then adds a rank-r bigram term
B(x_{k-1}) left to right, so each slot sees the token actually chosen before it.
"""

from __future__ import annotations

import torch
from torch import nn

from drafter_service.models.config import DrafterConfig
from drafter_service.models.layers import DraftLayer, rope_cos_sin
from dspark.model import RMSNorm


class BlockDrafter(nn.Module):
    def __init__(self, cfg: DrafterConfig, embed: nn.Embedding, lm_head: nn.Linear) -> None:
        super().__init__()
        self.cfg = cfg
        d = cfg.hidden_size
        self.fc = nn.Linear(len(cfg.target_layer_ids) * cfg.target_hidden_size, d, bias=False)
        self.context_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.input_layernorms = nn.ModuleList(
            RMSNorm(d, cfg.rms_norm_eps) for _ in range(cfg.num_draft_layers)
        )
        self.layers = nn.ModuleList(DraftLayer(cfg) for _ in range(cfg.num_draft_layers))
        self.norm = RMSNorm(d, cfg.rms_norm_eps)
        r = cfg.markov_rank
        if r > 0:
            self.markov_w1 = nn.Embedding(cfg.vocab_size, r)
            self.markov_w2 = nn.Linear(r, cfg.vocab_size, bias=False)
            nn.init.normal_(self.markov_w1.weight, std=0.02)
            nn.init.zeros_(self.markov_w2.weight)  # starts as DFlash, learns the correction
        if cfg.use_confidence_head:
            self.confidence_head = nn.Linear(d + r, 1)
        # The target's embeddings and LM head, shared and frozen: kept out of parameters and state dict.
        self.__dict__["shared"] = (embed, lm_head)

    @property
    def dtype(self) -> torch.dtype:
        """The weights' dtype: what serving computes in (training keeps fp32 masters under autocast)."""
        return self.fc.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.fc.weight.device

    # ---- pieces used by both training and serving --------------------------------------------------

    def context_features(self, hidden: torch.Tensor) -> torch.Tensor:
        """C_t = RMSNorm(W_fc . concat(H^{l1}_t ... H^{lk}_t))."""
        return self.context_norm(self.fc(hidden))

    def context_kv(
        self, features: torch.Tensor, positions: torch.Tensor
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per draft layer, K/V of context features [B, N, d] at positions [B, N]: what serving caches."""
        cos, sin = rope_cos_sin(positions, self.cfg.head_dim, self.cfg.rope_theta, self.dtype)
        return [layer.keys_values(features, cos, sin) for layer in self.layers]

    def run_block(
        self,
        tokens: torch.Tensor,  # [B, Q] block slot tokens (anchor or MASK)
        positions: torch.Tensor,  # [B, Q]
        context: list[tuple[torch.Tensor, torch.Tensor]],  # per layer K/V [B, K, Hkv, Dh]
        mask: torch.Tensor,  # [B, Q, K + Q]
    ) -> torch.Tensor:
        """Hidden states h of the block slots [B, Q, d], final norm applied."""
        embed, _ = self.shared
        h = embed(tokens)
        cos, sin = rope_cos_sin(positions, self.cfg.head_dim, self.cfg.rope_theta, self.dtype)
        for norm, layer, (k, v) in zip(self.input_layernorms, self.layers, context):
            h = layer(norm(h), h, cos, sin, k, v, mask)
        return self.norm(h)

    def base_logits(self, h: torch.Tensor) -> torch.Tensor:
        _, lm_head = self.shared
        return lm_head(h).float()

    def markov_bias(self, prev_tokens: torch.Tensor) -> torch.Tensor | float:
        """B(x_{k-1}) = W2 . W1[x_{k-1}]; 0 without a Markov head."""
        if self.cfg.markov_rank == 0:
            return 0.0
        return self.markov_w2(self.markov_w1(prev_tokens)).float()

    def confidence_logit(self, h: torch.Tensor, prev_tokens: torch.Tensor) -> torch.Tensor:
        """c^_k = w . concat(h_k, W1[x_{k-1}]) + b."""
        parts = [h] if self.cfg.markov_rank == 0 else [h, self.markov_w1(prev_tokens)]
        return self.confidence_head(torch.cat(parts, dim=-1)).squeeze(-1).float()
