"""Pieces every drafter is built from, named as DeepSpec names them (so state dicts map 1:1):
Qwen3 attention whose keys/values may come from elsewhere (the target's context features, or cached
entries), the SwiGLU MLP, and RoPE from the drafter's `rope_parameters` as transformers computes it.

Shapes are batched and padded: x [B, Q, d_in], extra keys/values [B, K, Hkv, Dh], mask [B, Q, K + Q].
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from drafter_service.models.config import DrafterConfig
from dspark.checkpoint import rope_frequencies
from dspark.errors import ModelLoadError
from dspark.model import RMSNorm, Rotary, apply_rotary


def drafter_rotary(cfg: DrafterConfig) -> Rotary:
    """The RoPE tables of `cfg.rope_parameters`, through the same transformers functions as the target's."""
    from transformers import Qwen3Config

    try:
        hf = Qwen3Config(
            hidden_size=cfg.hidden_size,
            num_attention_heads=cfg.num_attention_heads,
            num_key_value_heads=cfg.num_key_value_heads,
            head_dim=cfg.head_dim,
            max_position_embeddings=cfg.max_position_embeddings,
            rope_parameters=dict(cfg.rope_parameters),
        )
    except (KeyError, ValueError, TypeError) as exc:
        raise ModelLoadError(f"rope_parameters {cfg.rope_parameters}: {exc}") from exc
    with torch.device("cpu"):  # real tables even while the drafter is being built on the meta device
        return Rotary(*rope_frequencies(hf))


def rope_cos_sin(
    rotary: Rotary, positions: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [..., head_dim] for any-shaped integer positions: fp32 math, then the model's dtype."""
    cos, sin = rotary.cos_sin(positions.reshape(-1), dtype)
    return cos.view(*positions.shape, -1), sin.view(*positions.shape, -1)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, S, H, D] with cos/sin [B, S, D]."""
    flat = x.reshape(-1, *x.shape[2:])
    return apply_rotary(flat, cos.reshape(-1, cos.shape[-1]), sin.reshape(-1, sin.shape[-1])).view_as(x)


class Attention(nn.Module):
    """DeepSpec's `self_attn`: q/k/v/o projections (no bias) with per-head q/k RMSNorm before RoPE."""

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

    def keys_values(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """K/V of inputs x [B, S, d_in] at the positions of cos/sin [B, S, D]: what a cache stores."""
        b, s, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(b, s, -1, self.head_dim))
        return _rotate(k, cos, sin), self.v_proj(x).view(b, s, -1, self.head_dim)

    def forward(
        self,
        x: torch.Tensor,  # [B, Q, d_in] (normalised) input
        cos: torch.Tensor,
        sin: torch.Tensor,
        extra_k: torch.Tensor,  # [B, K, Hkv, Dh] keys the queries also see (context, cache)
        extra_v: torch.Tensor,
        mask: torch.Tensor,  # [B, Q, K + Q] True = attend
    ) -> torch.Tensor:
        return self.attend(x, cos, sin, after(extra_k, extra_v), mask)

    def attend(
        self,
        x: torch.Tensor,  # [B, Q, d_in] (normalised) input
        cos: torch.Tensor,
        sin: torch.Tensor,
        keys_with: KeysWith,  # the queries' own K/V -> every key and value they attend to
        mask: torch.Tensor | None,  # [B, Q, K] True = attend; None: every key
    ) -> torch.Tensor:
        b, q_len, _ = x.shape
        q = _rotate(self.q_norm(self.q_proj(x).view(b, q_len, -1, self.head_dim)), cos, sin)
        keys, values = keys_with(*self.keys_values(x, cos, sin))
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            keys,
            values,
            attn_mask=None if mask is None else mask[:, None],
            enable_gqa=True,
        )
        return self.o_proj(out.transpose(1, 2).reshape(b, q_len, -1))


# Given the queries' own keys and values [B, Q, Hkv, Dh], every key and value they attend to
# [B, Hkv, K, Dh]: where the others come from (a context tensor, a cache) is the caller's business.
KeysWith = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def after(extra_k: torch.Tensor, extra_v: torch.Tensor) -> KeysWith:
    """Keys [extra ; own] from extra K/V [B, K, Hkv, Dh] placed before the queries' own."""
    return lambda k, v: (
        torch.cat([extra_k, k], dim=1).transpose(1, 2),
        torch.cat([extra_v, v], dim=1).transpose(1, 2),
    )


class MLP(nn.Module):
    """DeepSpec's `mlp`: SiLU(gate) * up -> down, no bias."""

    def __init__(self, cfg: DrafterConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def pad_rows(tensors: list[torch.Tensor], length: int) -> torch.Tensor:
    """Stack per-request tensors [n_i, ...] into [R, length, ...], zero-padded at the end."""
    out = tensors[0].new_zeros(len(tensors), length, *tensors[0].shape[1:])
    for i, t in enumerate(tensors):
        out[i, : len(t)] = t
    return out
