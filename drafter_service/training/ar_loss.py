"""Training loss of the autoregressive drafters: a training-time test (TTT) of `ttt_length` steps.

Step 1 pairs the target feature g_t with x_{t+1} at every position; step i replaces the feature with
the drafter's own step-(i-1) output at t-1, exactly as a chain step does at serving time, and attends
to step-1 entries up to t-i+1 plus the step-j entries at t-i+j (j = 2..i). Every step predicts x_{t+2};
the soft cross-entropy against the target's distribution is weighted step_loss_decay^(i-1) (0.8).
"""

from __future__ import annotations

import torch

from drafter_service.models.autoregressive import ARDrafter
from drafter_service.training.target_states import TargetStates


def ttt_mask(n: int, step: int) -> torch.Tensor:
    """[n, step * n] visibility of step `step` queries over the keys of steps 1..step."""
    t = torch.arange(n)
    blocks = [t[None, :] <= (t[:, None] - step + 1)]
    for j in range(2, step + 1):
        blocks.append(t[None, :] == (t[:, None] - step + j))
    return torch.cat(blocks, dim=1)


def ar_loss(
    model: ARDrafter,
    tokens: torch.Tensor,
    lengths: torch.Tensor,
    answer_starts: torch.Tensor,
    states: TargetStates,
    positions_per_seq: int,
    generator: torch.Generator,
) -> tuple[torch.Tensor, dict]:
    cfg = model.cfg
    b, seq_len = tokens.shape
    n = seq_len - 1  # entries t = 0 .. L-2 (each needs x_{t+1})
    features = model.target_features(states.taps(cfg.target_layer_ids))[:, :n]
    next_tokens = tokens[:, 1:]
    pos = torch.arange(n)[None].expand(b, -1)
    # Loss only where x_{t+2} is an answer token; a random subset keeps the LM head affordable.
    t = torch.arange(n)[None]
    target_ok = (t + 2 < lengths[:, None]) & (t + 2 >= answer_starts[:, None])
    scores = torch.rand(b, n, generator=generator).masked_fill(~target_ok, 2.0)
    chosen = torch.zeros(b, n, dtype=torch.bool)
    chosen.scatter_(1, scores.argsort(dim=1)[:, :positions_per_seq], True)
    chosen &= target_ok

    keys_k, keys_v = [], []
    feats = h = features
    total, weight_sum, metrics = 0.0, 0.0, {}
    for step in range(1, cfg.ttt_length + 1):
        if step > 1:  # the feature at t is the drafter's own previous output at t-1
            feats = torch.cat([torch.zeros_like(h[:, :1]), h[:, :-1]], dim=1)
        x, residual = model.entry(next_tokens, feats)
        mask = ttt_mask(n, step)[None].expand(b, -1, -1)
        if keys_k:
            extra_k, extra_v = torch.cat(keys_k, 1), torch.cat(keys_v, 1)
        else:
            extra_k = x.new_zeros(b, 0, cfg.num_key_value_heads, cfg.head_dim)
            extra_v = extra_k
        # The step's own keys are the diagonal (t-i+i = t) block, which the layer appends itself.
        h = model.step(x, residual, pos, extra_k, extra_v, mask)
        k, v = model.entry_kv(x, pos)
        keys_k.append(k)
        keys_v.append(v)
        valid = chosen & (t >= step - 1)  # step i needs a real feature at t - (i - 1)
        rows = torch.nonzero(valid)
        logits = model.logits(h[valid])
        p_target = states.probs[rows[:, 0], rows[:, 1] + 1]
        soft_ce = -(p_target * logits.log_softmax(-1)).sum(-1).mean()
        w = cfg.step_loss_decay ** (step - 1)
        total = total + w * soft_ce
        weight_sum += w
        metrics[f"ce{step}"] = soft_ce.item()
    return total / weight_sum, metrics
