"""Autoregressive drafters: EAGLE-3 and MTP-1 (docs/ALGORITHM.md §5, baselines), DeepSpec's
`Qwen3Eagle3Model`.

Entry t of the drafter's own sequence combines a feature f_t with the embedding of the next token
x_{t+1}: input [input_layernorm(emb(x_{t+1})) ; hidden_norm(f_t)] (2d) feeds one decoder layer whose
output h_t predicts x_{t+2}. For committed positions f_t is the fused target feature g_t = fc .
concat(layers); while drafting a chain, f is the drafter's own previous output h. EAGLE-3 fuses
low/mid/high layers and is trained with a training-time test of `ttt_length` steps (its chain length);
MTP-1 reads only the last layer and drafts one token. Module names are DeepSpec's.
"""

from __future__ import annotations

import torch
from torch import nn

from drafter_service.models.config import DrafterConfig
from drafter_service.models.layers import MLP, Attention, drafter_rotary, rope_cos_sin
from dspark.model import RMSNorm


class ChainLayer(nn.Module):
    """DeepSpec's `Qwen3Eagle3DecoderLayer`: attention over [normed embedding ; normed feature],
    residual f."""

    def __init__(self, cfg: DrafterConfig) -> None:
        super().__init__()
        d = cfg.hidden_size
        self.self_attn = Attention(cfg, input_size=2 * d)
        self.mlp = MLP(cfg)
        self.hidden_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.input_layernorm = RMSNorm(d, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(d, cfg.rms_norm_eps)

    def forward(self, x, residual, cos, sin, extra_k, extra_v, mask) -> torch.Tensor:
        h = residual + self.self_attn(x, cos, sin, extra_k, extra_v, mask)
        return h + self.mlp(self.post_attention_layernorm(h))


class ARDrafter(nn.Module):
    def __init__(self, cfg: DrafterConfig, embed: nn.Embedding, lm_head: nn.Linear) -> None:
        super().__init__()
        self.cfg = cfg
        d = cfg.hidden_size
        self.fc = nn.Linear(len(cfg.target_layer_ids) * d, d, bias=False)
        self.layers = nn.ModuleList([ChainLayer(cfg)])  # one layer: config.py refuses more
        self.norm = RMSNorm(d, cfg.rms_norm_eps)
        self.rotary_emb = drafter_rotary(cfg)
        self.__dict__["shared"] = (embed, lm_head)  # the target's, frozen, not in the state dict

    @property
    def layer(self) -> ChainLayer:
        return self.layers[0]

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
        x = torch.cat([self.layer.input_layernorm(embed(next_tokens)), self.layer.hidden_norm(features)], -1)
        return x, features

    def entry_kv(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = rope_cos_sin(self.rotary_emb, positions, self.dtype)
        return self.layer.self_attn.keys_values(x, cos, sin)

    def step(self, x, residual, positions, extra_k, extra_v, mask) -> torch.Tensor:
        """Outputs h [B, Q, d] (pre-norm: the feature of the next chain step)."""
        cos, sin = rope_cos_sin(self.rotary_emb, positions, self.dtype)
        return self.layer(x, residual, cos, sin, extra_k, extra_v, mask)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        _, lm_head = self.shared
        return lm_head(self.norm(h)).float()
