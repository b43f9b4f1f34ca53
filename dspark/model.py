"""The target model: a Qwen3 / Llama decoder read top to bottom, over a paged KV cache.

Module names mirror Hugging Face's so a checkpoint's state dict loads as it is.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dspark.attention import AttentionBatch, paged_attention
from dspark.checkpoint import Checkpoint, ModelConfig, read_weights
from dspark.errors import ModelLoadError


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 like the reference, so bf16 weights do not change the statistics.
        return F.rms_norm(x.float(), (x.shape[-1],), self.weight.float(), self.eps).to(x.dtype)


class Rotary(nn.Module):
    def __init__(self, inv_freq: torch.Tensor, scaling: float) -> None:
        super().__init__()
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.scaling = scaling

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions[:, None].float() * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * self.scaling).to(dtype), (emb.sin() * self.scaling).to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [N, heads, D]; cos/sin: [N, D] (rotate-half convention)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_heads * cfg.head_dim, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=bias)
        self.o_proj = nn.Linear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, bias=bias)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, k_cache, v_cache, batch: AttentionBatch) -> torch.Tensor:
        n = x.shape[0]
        # Head counts come from the weights, so a tensor-parallel shard runs the same code.
        q = self.q_proj(x).view(n, -1, self.head_dim)
        k = self.k_proj(x).view(n, -1, self.head_dim)
        v = self.v_proj(x).view(n, -1, self.head_dim)
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        return self.o_proj(paged_attention(q, k, v, k_cache, v_cache, batch))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, k_cache, v_cache, batch):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, k_cache, v_cache, batch)
        return x + self.mlp(self.post_attention_layernorm(x))


class Decoder(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class CausalLM(nn.Module):
    """Forward over a flattened batch; returns the final hidden states and the tapped layer outputs
    (raw residual outputs of the given layers; -1 is the embedding output)."""

    def __init__(self, cfg: ModelConfig, inv_freq: torch.Tensor, rope_scaling: float = 1.0) -> None:
        super().__init__()
        self.config = cfg
        self.model = Decoder(cfg)
        self.rotary = Rotary(inv_freq, rope_scaling)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    @classmethod
    def on_meta(cls, ckpt: Checkpoint) -> CausalLM:
        """The model's structure without storage: shard it (dspark/tp.py), then `load_weights`."""
        with torch.device("meta"):
            return cls(ckpt.config, torch.empty_like(ckpt.inv_freq, device="meta"), ckpt.rope_scaling)

    @classmethod
    def from_checkpoint(
        cls, ckpt: Checkpoint, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"
    ) -> CausalLM:
        """The whole model, its weights read straight into `dtype` on `device`."""
        return cls.on_meta(ckpt).load_weights(ckpt, read_weights(ckpt, dtype, device))

    def load_weights(self, ckpt: Checkpoint, weights: dict[str, torch.Tensor]) -> CausalLM:
        """Give every parameter its tensor (as it is: no copy); the names must match exactly."""
        tied = ckpt.config.tie_word_embeddings
        expected = {k for k in self.state_dict() if not (tied and k == "lm_head.weight")}
        missing, unexpected = sorted(expected - weights.keys()), sorted(weights.keys() - expected)
        if missing or unexpected:
            raise ModelLoadError(
                f"checkpoint {ckpt.name!r} does not match its config: "
                f"missing {missing[:5]}, unexpected {unexpected[:5]}"
            )
        for name, tensor in weights.items():
            expect = self.get_parameter(name).shape
            if tensor.shape != expect:
                raise ModelLoadError(
                    f"checkpoint {ckpt.name!r}: {name} has shape {tuple(tensor.shape)}, "
                    f"its config says {tuple(expect)}"
                )
        self.load_state_dict(weights, strict=False, assign=True)
        if tied:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.rotary.inv_freq = ckpt.inv_freq.to(self.model.embed_tokens.weight.device, copy=True)
        return self.eval()

    def forward(
        self,
        input_ids: torch.Tensor,  # [N]
        positions: torch.Tensor,  # [N]
        batch: AttentionBatch,
        k_caches: list[torch.Tensor],
        v_caches: list[torch.Tensor],
        tap_layers: tuple[int, ...] = (),
    ) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        x = self.model.embed_tokens(input_ids)
        cos, sin = self.rotary.cos_sin(positions, x.dtype)
        # Layer -1 is the embedding output (DeepSpec's convention); whole on every tensor-parallel rank.
        taps: dict[int, torch.Tensor] = {-1: x} if -1 in tap_layers else {}
        for i, layer in enumerate(self.model.layers):
            x = layer(x, cos, sin, k_caches[i], v_caches[i], batch)
            if i in tap_layers:
                taps[i] = x  # raw residual output of layer i, before any final norm
        return x, taps

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.model.norm(hidden)).float()
