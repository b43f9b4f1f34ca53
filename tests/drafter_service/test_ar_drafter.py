"""EAGLE-3 / MTP-1: the training-time-test mask mirrors chain drafting, and the TTT loss trains."""

from __future__ import annotations

import torch
from torch import nn

from drafter_service.models.autoregressive import ARDrafter
from drafter_service.models.config import DrafterConfig
from drafter_service.training.ar_loss import ar_loss, ttt_mask
from drafter_service.training.target_states import TargetStates

V, D = 40, 32


def test_ttt_mask_matches_chain_drafting():
    n = 6
    # Step 1: plain causal attention over the target-feature entries.
    assert torch.equal(ttt_mask(n, 1), torch.tril(torch.ones(n, n, dtype=torch.bool)))
    # Step 3 at entry t = 4 is the third chain step after the committed entry 2: it sees target
    # entries 0..2, the step-2 entry at 3 and itself (step 3 at 4).
    m = ttt_mask(n, 3)[4].view(3, n)
    assert m[0].nonzero().flatten().tolist() == [0, 1, 2]
    assert m[1].nonzero().flatten().tolist() == [3]
    assert m[2].nonzero().flatten().tolist() == [4]


def test_ttt_loss_decreases_on_a_tiny_overfit_run():
    torch.manual_seed(0)
    cfg = DrafterConfig(
        "eagle3",
        vocab_size=V,
        hidden_size=D,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        intermediate_size=64,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        max_position_embeddings=128,
        num_target_layers=3,
        target_layer_ids=[0, 1, 2],
        ttt_length=4,
    )
    embed, head = nn.Embedding(V, D), nn.Linear(D, V, bias=False)
    embed.requires_grad_(False)
    head.requires_grad_(False)
    model = ARDrafter(cfg, embed, head)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(2, V, (2, 20), generator=gen)
    states = TargetStates(
        {i: torch.randn(2, 20, D, generator=gen) for i in range(3)},
        torch.softmax(torch.randn(2, 20, V, generator=gen) * 3, -1),
    )
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    seen = []
    for _ in range(80):
        loss, metrics = ar_loss(
            model,
            tokens,
            torch.tensor([20, 16]),
            torch.tensor([3, 5]),
            states,
            12,
            torch.Generator().manual_seed(2),
        )
        seen.append(metrics)
        opt.zero_grad()
        loss.backward()
        opt.step()
    for step in range(1, 5):  # every TTT step's own loss falls, the later (self-fed) ones included
        assert seen[-1][f"ce{step}"] < 0.85 * seen[0][f"ce{step}"], (step, seen[0], seen[-1])
