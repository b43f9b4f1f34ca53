"""An independent reference for a DeepSpec DSpark drafter: the inference math DeepSpec documents
(deepspec/eval/dspark/draft_ops.py, modeling/dspark/{qwen3/modeling,markov_head,common}.py at commit
afdfa7c9382a3341a3e6f17756dd816da79f132c), written out plainly over the raw state dict and config.json
of one checkpoint: one sequence, float64, explicit softmax attention, no cache, no batching, no code
shared with drafter_service.
"""

from __future__ import annotations

import torch

Weights = dict[str, torch.Tensor]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def rotate(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate-half RoPE with base `theta`: x [S, heads, d] at positions [S]."""
    d = x.shape[-1]
    inv_freq = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = positions[:, None].double() * inv_freq[None, :]
    cos = torch.cat([angles.cos(), angles.cos()], -1)[:, None, :]
    sin = torch.cat([angles.sin(), angles.sin()], -1)[:, None, :]
    half = torch.cat([-x[..., d // 2 :], x[..., : d // 2]], -1)
    return x * cos + half * sin


def block_states(
    w: Weights, config: dict, features: torch.Tensor, anchor: int, theta: float | None = None
) -> torch.Tensor:
    """h [gamma, H] (after the final norm) of the block [anchor, MASK, ...] at positions T .. T+gamma-1,
    given the target features [T, K*H] of the context positions 0 .. T-1."""
    w = {k: v.double() for k, v in w.items()}
    eps, d = config["rms_norm_eps"], config["head_dim"]
    theta = config["rope_parameters"]["rope_theta"] if theta is None else theta
    gamma, t = config["block_size"], len(features)
    ctx = rms_norm(features.double() @ w["fc.weight"].T, w["hidden_norm.weight"], eps)
    x = w["embed_tokens.weight"][[anchor] + [config["mask_token_id"]] * (gamma - 1)]
    key_pos = torch.arange(t + gamma)
    groups = config["num_attention_heads"] // config["num_key_value_heads"]
    for i in range(config["num_hidden_layers"]):
        p = f"layers.{i}."
        xn = rms_norm(x, w[p + "input_layernorm.weight"], eps)
        q = rms_norm(
            (xn @ w[p + "self_attn.q_proj.weight"].T).view(gamma, -1, d),
            w[p + "self_attn.q_norm.weight"],
            eps,
        )
        both = torch.cat([ctx, xn])  # keys and values of the context (no input norm) and of the block
        k = rms_norm(
            (both @ w[p + "self_attn.k_proj.weight"].T).view(t + gamma, -1, d),
            w[p + "self_attn.k_norm.weight"],
            eps,
        )
        v = (both @ w[p + "self_attn.v_proj.weight"].T).view(t + gamma, -1, d)
        q, k = rotate(q, key_pos[t:], theta), rotate(k, key_pos, theta)
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k) / d**0.5  # every slot sees everything: no mask
        attn = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(gamma, -1)
        x = x + attn @ w[p + "self_attn.o_proj.weight"].T
        xn = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        gate, up = xn @ w[p + "mlp.gate_proj.weight"].T, xn @ w[p + "mlp.up_proj.weight"].T
        x = x + (torch.nn.functional.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
    return rms_norm(x, w["norm.weight"], eps)


def corrected_logits(
    w: Weights, config: dict, h: torch.Tensor, previous: list[int]
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(logits [n, V], confidence logits [n] or None) of the first n slots, slot k conditioned on
    previous[k] (the anchor, then the drafted tokens), the rnn state carried from slot to slot."""
    w = {k: v.double() for k, v in w.items()}
    rank = config["markov_rank"]
    logits, confidences = [], []
    state = torch.zeros(rank, dtype=torch.float64)
    for k, prev in enumerate(previous):
        base = w["lm_head.weight"] @ h[k]
        e = w["markov_head.markov_w1.weight"][prev] if rank else None
        if rank == 0:
            bias = 0.0
        elif config["markov_head_type"] == "vanilla":
            bias = w["markov_head.markov_w2.weight"] @ e
        elif config["markov_head_type"] == "gated":
            g = torch.sigmoid(
                w["markov_head.gate_proj.weight"] @ torch.cat([h[k], e]) + w["markov_head.gate_proj.bias"]
            )
            bias = w["markov_head.markov_w2.weight"] @ (g * e)
        else:  # rnn
            z = (
                w["markov_head.joint_proj.weight"] @ torch.cat([state, e, h[k]])
                + w["markov_head.joint_proj.bias"]
            )
            g, c, o = z[:rank].sigmoid(), z[rank : 2 * rank].tanh(), z[2 * rank :].tanh()
            state = g * state + (1 - g) * c
            bias = w["markov_head.markov_w2.weight"] @ o
        logits.append(base + bias)
        if config["enable_confidence_head"]:
            feats = torch.cat([h[k], e]) if config["confidence_head_with_markov"] else h[k]
            confidences.append(
                w["confidence_head.proj.weight"][0] @ feats + w["confidence_head.proj.bias"][0]
            )
    conf = torch.stack(confidences) if confidences else None
    return torch.stack(logits), conf
