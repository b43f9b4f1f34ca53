"""Training losses of the block drafters (docs/ALGORITHM.md §5).

Anchors are sampled in each sequence's answer; the gamma-slot blocks after all anchors of a sequence
are packed into one pass with exact masks (a slot sees context positions before its anchor and the
slots of its own block). Losses are means over valid slots weighted w_k = exp(-(k-1)/4):
L_ce (teacher-forced x_{k-1} feeds the Markov head, whichever its type), L_1 = ||p_draft - p_target||_1
and L_conf, the BCE of the confidence logit against c* = clamp(1 - L_1 / 2, 0, 1), the exact
acceptance probability.
DSpark: 0.1 L_ce + 0.9 L_1 + 1.0 L_conf. DFlash: L_ce only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from drafter_service.models.block import BlockDrafter
from drafter_service.training.target_states import TargetStates


@dataclass
class PackedBlocks:
    tokens: torch.Tensor  # [B, Q] slot inputs: anchor or MASK
    positions: torch.Tensor  # [B, Q]
    mask: torch.Tensor  # [B, Q, L + Q]
    valid: torch.Tensor  # [B, Q] slot predicts a token inside the answer
    labels: torch.Tensor  # [B, Q] x_k, the target's own token
    prev: torch.Tensor  # [B, Q] x_{k-1} (teacher forcing; the anchor for k = 1)
    target_rows: torch.Tensor  # [B, Q] position t whose target distribution p(x_{t+1}) applies
    slot: torch.Tensor  # [Q] k - 1, the slot index inside its block


def sample_anchors(
    lengths: torch.Tensor, answer_starts: torch.Tensor, per_seq: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Up to `per_seq` distinct anchors s in [answer_start, length - 2] per sequence: (anchors, valid)."""
    anchors = torch.zeros(len(lengths), per_seq, dtype=torch.long)
    valid = torch.zeros(len(lengths), per_seq, dtype=torch.bool)
    for b, (n, p) in enumerate(zip(lengths.tolist(), answer_starts.tolist())):
        choices = torch.arange(p, n - 1)
        pick = choices[torch.randperm(len(choices), generator=generator)[:per_seq]].sort().values
        anchors[b, : len(pick)] = pick
        valid[b, : len(pick)] = True
    return anchors, valid


def pack_blocks(
    tokens: torch.Tensor,
    lengths: torch.Tensor,
    anchors: torch.Tensor,
    anchor_valid: torch.Tensor,
    block_size: int,
    mask_token_id: int,
) -> PackedBlocks:
    b, seq_len = tokens.shape
    a = anchors.shape[1]
    slot = torch.arange(block_size).repeat(a)  # [Q]
    block_of = torch.arange(a).repeat_interleave(block_size)  # [Q]
    s = anchors[:, block_of]  # [B, Q] anchor position of each slot
    positions = s + slot
    slot_tokens = torch.where(slot == 0, tokens.gather(1, s), torch.full_like(s, mask_token_id))
    label_pos = positions + 1
    valid = anchor_valid[:, block_of] & (label_pos < lengths[:, None])
    labels = tokens.gather(1, label_pos.clamp(max=seq_len - 1))
    prev = tokens.gather(1, positions.clamp(max=seq_len - 1))
    # A slot sees context strictly before its anchor (the anchor enters as slot 0's token) ...
    ctx_mask = torch.arange(seq_len)[None, None, :] < s[:, :, None]
    # ... and every slot of its own block, in both directions.
    same_block = (block_of[:, None] == block_of[None, :])[None].expand(b, -1, -1)
    mask = torch.cat([ctx_mask, same_block], dim=-1)
    return PackedBlocks(
        slot_tokens, positions, mask, valid, labels, prev, positions.clamp(max=seq_len - 1), slot
    )


def block_loss(
    model: BlockDrafter,
    tokens: torch.Tensor,
    lengths: torch.Tensor,
    answer_starts: torch.Tensor,
    states: TargetStates,
    anchors_per_seq: int,
    generator: torch.Generator,
) -> tuple[torch.Tensor, dict]:
    cfg = model.cfg
    anchors, anchor_valid = sample_anchors(lengths, answer_starts, anchors_per_seq, generator)
    packed = pack_blocks(tokens, lengths, anchors, anchor_valid, cfg.block_size, cfg.mask_token_id)
    seq_len = tokens.shape[1]
    features = model.context_features(states.taps(cfg.target_layer_ids))
    context = model.context_kv(features, torch.arange(seq_len)[None].expand(len(tokens), -1))
    h = model.run_block(packed.tokens, packed.positions, context, packed.mask)

    v = packed.valid
    h_v, prev_v, labels_v = h[v], packed.prev[v], packed.labels[v]
    slot_v = packed.slot[None].expand_as(v)[v]
    p_target = states.probs[torch.nonzero(v)[:, 0], packed.target_rows[v]]
    logits = model.base_logits(h_v)
    if model.markov_head is not None:
        # Block by block (the rnn head carries a state across a block's slots), teacher-forced.
        blocks = (len(tokens), -1, cfg.block_size)
        latents = model.markov_head.block_latents(packed.prev.view(blocks), h.view(*blocks, h.shape[-1]))
        logits = logits + model.markov_head.bias(latents.flatten(1, 2)[v])
    weights = torch.exp(-slot_v.float() / 4)
    wsum = weights.sum()
    ce = (F.cross_entropy(logits, labels_v, reduction="none") * weights).sum() / wsum
    p_draft = logits.softmax(-1)
    l1_each = (p_draft - p_target).abs().sum(-1)
    l1 = (l1_each * weights).sum() / wsum
    metrics = {"ce": ce.item(), "l1": l1.item()}
    if cfg.kind == "dflash":
        return ce, metrics
    loss = 0.1 * ce + 0.9 * l1
    if cfg.enable_confidence_head:
        c_star = (1 - 0.5 * l1_each).clamp(0, 1).detach()
        conf = model.confidence_logit(h_v, prev_v)
        l_conf = (F.binary_cross_entropy_with_logits(conf, c_star, reduction="none") * weights).sum() / wsum
        loss = loss + l_conf
        metrics["conf"] = l_conf.item()
    return loss, metrics
