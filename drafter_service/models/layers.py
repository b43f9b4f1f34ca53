"""The decoder layer all drafters are built from: Qwen3-style attention whose keys/values may come
from elsewhere (the target's context features, or cached entries), then a SwiGLU MLP.

Shapes are batched and padded: x [B, Q, d_in], extra keys/values [B, K, Hkv, Dh], mask [B, Q, K + Q].
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from drafter_service.models.config import DrafterConfig
from dspark.model import RMSNorm, apply_rotary


def rope_cos_sin(
    positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin for any-shaped integer positions, shaped [..., head_dim], on the positions' device.

    Computed in fp32 (angles of far positions lose their low bits in bf16) and only then cast to the
    model's dtype, as the target does, so rotated q/k keep the dtype the attention runs in.
    """
    inv_freq = 1.0 / (
        theta ** (torch.arange(0, head_dim, 2, dtype=torch.float, device=positions.device) / head_dim)
    )
    freqs = positions[..., None].float() * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, S, H, D] with cos/sin [B, S, D]."""
    flat = x.reshape(-1, *x.shape[2:])
    return apply_rotary(flat, cos.reshape(-1, cos.shape[-1]), sin.reshape(-1, sin.shape[-1])).view_as(x)


class DraftLayer(nn.Module):
    def __init__(self, cfg: DrafterConfig, input_size: int | None = None) -> None:
        super().__init__()
        d_in = input_size or cfg.hidden_size
        self.head_dim = cfg.head_dim
        self.q_proj = nn.Linear(d_in, cfg.num_attention_heads * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(d_in, cfg.num_key_value_heads * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(d_in, cfg.num_key_value_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.num_attention_heads * cfg.head_dim, cfg.hidden_size, bias=False)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def keys_values(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """K/V of inputs x [B, S, d_in] at the positions of cos/sin [B, S, D]: what a cache stores."""
        b, s, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(b, s, -1, self.head_dim))
        return _rotate(k, cos, sin), self.v_proj(x).view(b, s, -1, self.head_dim)

    def forward(
        self,
        x: torch.Tensor,  # [B, Q, d_in] this layer's (normalised) input
        residual: torch.Tensor,  # [B, Q, d]
        cos: torch.Tensor,
        sin: torch.Tensor,
        extra_k: torch.Tensor,  # [B, K, Hkv, Dh] keys the queries also see (context, cache)
        extra_v: torch.Tensor,
        mask: torch.Tensor,  # [B, Q, K + Q] True = attend
    ) -> torch.Tensor:
        b, q_len, _ = x.shape
        q = _rotate(self.q_norm(self.q_proj(x).view(b, q_len, -1, self.head_dim)), cos, sin)
        k, v = self.keys_values(x, cos, sin)
        keys = torch.cat([extra_k, k], dim=1).transpose(1, 2)
        values = torch.cat([extra_v, v], dim=1).transpose(1, 2)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), keys, values, attn_mask=mask[:, None], enable_gqa=True
        )
        h = residual + self.o_proj(out.transpose(1, 2).reshape(b, q_len, -1))
        normed = self.post_attention_layernorm(h)
        return h + self.down_proj(F.silu(self.gate_proj(normed)) * self.up_proj(normed))


def pad_rows(tensors: list[torch.Tensor], length: int) -> torch.Tensor:
    """Stack per-request tensors [n_i, ...] into [R, length, ...], zero-padded at the end."""
    out = tensors[0].new_zeros(len(tensors), length, *tensors[0].shape[1:])
    for i, t in enumerate(tensors):
        out[i, : len(t)] = t
    return out
