"""The DSpark block drafter (docs/ALGORITHM.md §2-§4), DeepSpec's `Qwen3DSparkModel`; with no Markov
head and no confidence head it is DFlash.

After the target commits the anchor x0 at position s, the drafter reads [x0, MASK, ..., MASK] (gamma
slots at positions s .. s+gamma-1) in one pass: each slot attends to the fused target features of
every context position < s and to every slot of its own block. Slot j's output h_{j+1} gives base
logits U_{j+1} for the token at position s+j+1. The Markov head (markov.py) then adds its term left
to right, so each slot sees the token actually chosen before it.

Module names are DeepSpec's, so the state dict is DeepSpec's minus `embed_tokens` / `lm_head`: those
are the target's own, shared and frozen (checkpoint.py writes copies of them, as DeepSpec does).
"""

from __future__ import annotations

import torch
from torch import nn

from drafter_service.models.config import DrafterConfig
from drafter_service.models.layers import MLP, Attention, KeysWith, after, drafter_rotary, rope_cos_sin
from drafter_service.models.markov import ConfidenceHead, MarkovHead
from dspark.model import RMSNorm


class BlockLayer(nn.Module):
    """DeepSpec's `Qwen3DSparkDecoderLayer`: pre-norm attention over [context ; block], then the MLP."""

    def __init__(self, cfg: DrafterConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, h, cos, sin, keys_with: KeysWith, mask) -> torch.Tensor:
        h = h + self.self_attn.attend(self.input_layernorm(h), cos, sin, keys_with, mask)
        return h + self.mlp(self.post_attention_layernorm(h))


class BlockDrafter(nn.Module):
    def __init__(self, cfg: DrafterConfig, embed: nn.Embedding, lm_head: nn.Linear) -> None:
        super().__init__()
        self.cfg = cfg
        d, r = cfg.hidden_size, cfg.markov_rank
        self.layers = nn.ModuleList(BlockLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(d, cfg.rms_norm_eps)
        self.rotary_emb = drafter_rotary(cfg)  # inv_freq is not persistent: not in the state dict
        self.fc = nn.Linear(len(cfg.target_layer_ids) * d, d, bias=False)
        self.hidden_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.markov_head = MarkovHead(cfg.markov_head_type, cfg.vocab_size, r, d) if r > 0 else None
        if self.markov_head is not None:
            nn.init.normal_(self.markov_head.markov_w1.weight, std=0.02)
            nn.init.zeros_(self.markov_head.markov_w2.weight)  # starts as DFlash, learns the correction
        self.confidence_head = (
            ConfidenceHead(d + (r if cfg.confidence_head_with_markov else 0))
            if cfg.enable_confidence_head
            else None
        )
        # The target's embeddings and LM head, shared and frozen: kept out of parameters and state dict.
        self.__dict__["shared"] = (embed, lm_head)

    @property
    def dtype(self) -> torch.dtype:
        """The weights' dtype: what serving computes in (training keeps fp32 masters under autocast)."""
        return self.fc.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.fc.weight.device

    def cast_weights(self, dtype: torch.dtype) -> BlockDrafter:
        """Compute in `dtype`: its own weights cast; the shared embeddings and LM head stay the target's
        and the RoPE tables fp32 (a bf16 inv_freq would round the frequencies themselves)."""
        for name, child in self.named_children():
            if name != "rotary_emb":
                child.to(dtype)
        return self

    # ---- pieces used by both training and serving --------------------------------------------------

    def context_features(self, hidden: torch.Tensor) -> torch.Tensor:
        """C_t = hidden_norm(fc . concat(H^{l1}_t ... H^{lk}_t)), the target's states in the drafter's
        dtype."""
        return self.hidden_norm(self.fc(hidden.to(self.dtype)))

    def context_kv(
        self, features: torch.Tensor, positions: torch.Tensor
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per draft layer, K/V of context features [B, N, d] at positions [B, N]: what serving caches."""
        cos, sin = rope_cos_sin(self.rotary_emb, positions, self.dtype)
        return [layer.self_attn.keys_values(features, cos, sin) for layer in self.layers]

    def run_block(
        self,
        tokens: torch.Tensor,  # [B, Q] block slot tokens (anchor or MASK)
        positions: torch.Tensor,  # [B, Q]
        context: list[tuple[torch.Tensor, torch.Tensor]],  # per layer K/V [B, K, Hkv, Dh]
        mask: torch.Tensor,  # [B, Q, K + Q]
    ) -> torch.Tensor:
        """Hidden states h of the block slots [B, Q, d], final norm applied."""
        return self.run_block_into(tokens, positions, [after(k, v) for k, v in context], mask)

    def run_block_into(
        self,
        tokens: torch.Tensor,  # [B, Q]
        positions: torch.Tensor,  # [B, Q]
        keys_with: list[KeysWith],  # per layer: where the context's keys are, and the block's go
        mask: torch.Tensor | None,  # [B, Q, K] over what keys_with returns; None: all of it
    ) -> torch.Tensor:
        """`run_block` with the context's K/V wherever the caller keeps them (serving: a cache)."""
        embed, _ = self.shared
        h = embed(tokens).to(self.dtype)  # the target's embeddings, in the drafter's dtype
        cos, sin = rope_cos_sin(self.rotary_emb, positions, self.dtype)
        for layer, merge in zip(self.layers, keys_with):
            h = layer(h, cos, sin, merge, mask)
        return self.norm(h)

    def base_logits(self, h: torch.Tensor) -> torch.Tensor:
        _, lm_head = self.shared
        return lm_head(h).float()

    def markov_step(
        self, prev: torch.Tensor, h: torch.Tensor, state: torch.Tensor | None
    ) -> tuple[torch.Tensor | float, torch.Tensor | None]:
        """(Markov term added to slot k's logits, next state) from x_{k-1}, h_k and the head's state;
        0 without a Markov head. Start each block with state None."""
        if self.markov_head is None:
            return 0.0, None
        if state is None:
            state = self.markov_head.initial_state(h)
        z, state = self.markov_head.step(prev, h, state)
        return self.markov_head.bias(z), state

    def confidence_logit(self, h: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
        """c^_k = proj([h_k ; W1[x_{k-1}]]) + b, or proj(h_k) + b without the Markov input."""
        if self.cfg.confidence_head_with_markov:
            h = torch.cat([h, self.markov_head.markov_w1(prev)], dim=-1)
        return self.confidence_head(h)
