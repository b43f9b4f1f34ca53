"""Autoregressive drafters: EAGLE-3 and MTP-1 (DSPARK.md §3, baselines).

Entry t of the drafter's own sequence combines a feature f_t with the embedding of the next token
x_{t+1}: input [norm(emb(x_{t+1})); norm(f_t)] (2d) feeds one decoder layer whose output h_t predicts
x_{t+2}. For committed positions f_t is the fused target feature g_t = W_fc . concat(layers); while
drafting a chain, f is the drafter's own previous output h. EAGLE-3 fuses low/mid/high layers and is
trained with a 7-step training-time test; MTP-1 reads only the last layer and drafts one token.
"""

from __future__ import annotations

import torch
from torch import nn

from drafter_service.models.config import DrafterConfig
from drafter_service.models.layers import DraftLayer, rope_cos_sin
from dspark.model import RMSNorm


class ARDrafter(nn.Module):
    def __init__(self, cfg: DrafterConfig, embed: nn.Embedding, lm_head: nn.Linear) -> None:
        super().__init__()
        self.cfg = cfg
        d = cfg.hidden_size
        self.fc = nn.Linear(len(cfg.target_layer_ids) * cfg.target_hidden_size, d, bias=False)
        self.embed_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.feature_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.layer = DraftLayer(cfg, input_size=2 * d)
        self.norm = RMSNorm(d, cfg.rms_norm_eps)
        self.__dict__["shared"] = (embed, lm_head)  # the target's, frozen, not in the state dict

    @property
    def dtype(self) -> torch.dtype:
        """The weights' dtype: what serving computes in (training keeps fp32 masters under autocast)."""
        return self.fc.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.fc.weight.device

    def target_features(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.fc(hidden)

    def entry(self, next_tokens: torch.Tensor, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(layer input [.., 2d], residual [.., d]) of entries pairing features with next tokens."""
        embed, _ = self.shared
        return torch.cat([self.embed_norm(embed(next_tokens)), self.feature_norm(features)], -1), features

    def entry_kv(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = rope_cos_sin(positions, self.cfg.head_dim, self.cfg.rope_theta, self.dtype)
        return self.layer.keys_values(x, cos, sin)

    def step(self, x, residual, positions, extra_k, extra_v, mask) -> torch.Tensor:
        """Outputs h [B, Q, d] (pre-norm: the feature of the next chain step)."""
        cos, sin = rope_cos_sin(positions, self.cfg.head_dim, self.cfg.rope_theta, self.dtype)
        return self.layer(x, residual, cos, sin, extra_k, extra_v, mask)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        _, lm_head = self.shared
        return lm_head(self.norm(h)).float()
