"""The DSpark block drafter: masks, the Markov head's effect on q, losses, checkpoints, configs."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from drafter_service.models.block import BlockDrafter
from drafter_service.models.checkpoint import load_drafter, save_drafter
from drafter_service.models.config import DrafterConfig
from drafter_service.training.block_loss import block_loss, pack_blocks
from drafter_service.training.target_states import TargetStates
from dspark.drafter import DraftRequest
from dspark.errors import ModelLoadError
from dspark.sampling import probs_from_logits
from dspark.sampling_params import SamplingParams

V, D, GAMMA, MASK = 40, 32, 4, 1


def tiny_config(rank: int = 8, conf: bool = True, head: str = "vanilla", **overrides) -> DrafterConfig:
    fields = dict(
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
        target_layer_ids=[0, 1],
        block_size=GAMMA,
        mask_token_id=MASK,
        num_anchors=6,
        markov_rank=rank,
        markov_head_type=head if rank else None,
        enable_confidence_head=conf,
        confidence_head_with_markov=conf and rank > 0,
    )
    return DrafterConfig("dspark" if rank or conf else "dflash", **{**fields, **overrides})


def make(rank: int = 8, conf: bool = True, seed: int = 0, head: str = "vanilla") -> BlockDrafter:
    torch.manual_seed(seed)
    embed, lm_head = nn.Embedding(V, D), nn.Linear(D, V, bias=False)
    embed.requires_grad_(False)
    lm_head.requires_grad_(False)
    model = BlockDrafter(tiny_config(rank, conf, head), embed, lm_head)
    if rank:
        nn.init.normal_(model.markov_head.markov_w2.weight, std=0.5)  # a visible Markov term from the start
    return model


def test_block_slots_never_see_positions_at_or_after_their_anchor():
    tokens = torch.arange(20)[None] % V
    anchors = torch.tensor([[5, 11]])
    packed = pack_blocks(tokens, torch.tensor([20]), anchors, torch.tensor([[True, True]]), GAMMA, MASK)
    ctx = packed.mask[0, :, :20]
    for q in range(2 * GAMMA):
        s = int(anchors[0, q // GAMMA])
        assert ctx[q, :s].all() and not ctx[q, s:].any()
    # Behaviour, not just the mask: changing every context feature at or after the anchor changes nothing.
    model = make()
    hidden = torch.randn(1, 20, 2 * D)

    def block_out(h):
        feats = model.context_features(h)
        context = model.context_kv(feats, torch.arange(20)[None])
        return model.run_block(
            packed.tokens[:, :GAMMA],
            packed.positions[:, :GAMMA],
            context,
            packed.mask[:, :GAMMA, : 20 + GAMMA],
        )

    perturbed = hidden.clone()
    perturbed[:, 5:] += torch.randn(1, 15, 2 * D)
    torch.testing.assert_close(block_out(hidden), block_out(perturbed))
    changed = hidden.clone()
    changed[:, 4] += 1.0
    assert not torch.allclose(block_out(hidden), block_out(changed))


@pytest.mark.parametrize("head_dtype", ["float32", "bfloat16"])
def test_markov_term_follows_the_sampled_previous_token_and_is_q(head_dtype):
    from drafter_service.runtime.block import BlockDraftRuntime

    model = make()
    runtime = BlockDraftRuntime.of(model, GAMMA, head_dtype)
    assert runtime.heads.dtype == getattr(torch, head_dtype)
    hidden = torch.randn(6, 2 * D)
    runtime.add_context("s", list(range(6)), hidden)
    params = SamplingParams(temperature=0.8, top_k=20)
    request = DraftRequest("s", list(range(7)), GAMMA, params, torch.Generator().manual_seed(3))
    proposal = runtime.propose([request])[0]
    # Recompute every slot's q from the block's base logits and the token sampled just before it.
    context = model.context_kv(model.context_features(hidden[None]), torch.arange(6)[None])
    tokens = torch.tensor([[6] + [MASK] * (GAMMA - 1)])
    mask = torch.ones(1, GAMMA, 6 + GAMMA, dtype=torch.bool)
    h = model.run_block(tokens, 6 + torch.arange(GAMMA)[None], context, mask)
    base = runtime.heads.base_logits(h)[0]
    # The serving head is the model's LM head, up to the rounding of its dtype.
    tolerance = {"float32": 1e-5, "bfloat16": 2e-2}[head_dtype]
    torch.testing.assert_close(base, model.base_logits(h)[0], atol=tolerance, rtol=tolerance)
    prev = 6

    def bias(token):
        return model.markov_head.bias(model.markov_head.markov_w1(torch.tensor(token)))

    for k, token in enumerate(proposal.token_ids):
        q = probs_from_logits(base[k] + bias(prev), params)
        torch.testing.assert_close(proposal.probs[k], q)
        other = probs_from_logits(base[k] + bias((prev + 1) % V), params)
        assert not torch.allclose(q, other)  # a different previous token really changes q
        prev = token


def _overfit(model, loss_name: str, steps: int = 100) -> tuple[float, float]:
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(2, V, (2, 24), generator=gen)
    lengths, starts = torch.tensor([24, 20]), torch.tensor([4, 6])
    probs = torch.softmax(torch.randn(2, 24, V, generator=gen) * 3, -1)
    states = TargetStates(
        {0: torch.randn(2, 24, D, generator=gen), 1: torch.randn(2, 24, D, generator=gen)}, probs
    )
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    seen = []
    for _ in range(steps):
        # The same anchors every step: an overfit run on one batch.
        loss, metrics = block_loss(
            model, tokens, lengths, starts, states, 6, torch.Generator().manual_seed(1)
        )
        seen.append(metrics[loss_name])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return seen[0], seen[-1]


@pytest.mark.parametrize("loss_name", ["ce", "l1", "conf"])
def test_each_dspark_loss_decreases_on_a_tiny_overfit_run(loss_name):
    first, last = _overfit(make(), loss_name)
    assert last < 0.75 * first, (first, last)


def test_dflash_cross_entropy_decreases():
    first, last = _overfit(make(rank=0, conf=False), "ce")
    assert last < 0.8 * first


def test_checkpoint_round_trip(tmp_path):
    model = make()
    model.cfg.sts_temperatures = {1.0: [1.5, 1.0, 0.5, 2.0]}
    save_drafter(model, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "config.json",
        "dspark_serve.json",
        "model.safetensors",
        "sts_temperature_1.0.json",
    ]
    embed, head = model.shared
    loaded = load_drafter(tmp_path, embed, head)
    assert loaded.cfg == model.cfg
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name
    with pytest.raises(ModelLoadError, match="trained for vocab"):
        load_drafter(tmp_path, nn.Embedding(V + 1, D), head)
    with pytest.raises(ModelLoadError, match="embed_tokens.weight is not the target's"):
        load_drafter(tmp_path, nn.Embedding(V, D), head)


def test_checkpoint_loads_in_the_targets_dtype_and_computes_in_it(tmp_path):
    """Served beside a bf16 target, the drafter's weights are bf16 (no fp32 copy), every activation
    stays bf16 (RoPE tables are cast after fp32 math), and its logits track the fp32 drafter's."""
    model = make()
    save_drafter(model, tmp_path)
    embed, head = model.shared
    half_embed = nn.Embedding(V, D).to(torch.bfloat16)
    half_head = nn.Linear(D, V, bias=False).to(torch.bfloat16)
    half_embed.load_state_dict(embed.state_dict())
    half_head.load_state_dict(head.state_dict())
    half = load_drafter(tmp_path, half_embed, half_head)
    assert half.dtype == torch.bfloat16 and {p.dtype for p in half.parameters()} == {torch.bfloat16}

    hidden = torch.randn(1, 10, 2 * D)
    tokens = torch.tensor([[7] + [MASK] * (GAMMA - 1)])
    positions = 10 + torch.arange(GAMMA)[None]
    mask = torch.ones(1, GAMMA, 10 + GAMMA, dtype=torch.bool)

    def logits(m, dtype):
        context = m.context_kv(m.context_features(hidden.to(dtype)), torch.arange(10)[None])
        assert all(k.dtype == v.dtype == dtype for k, v in context)
        h = m.run_block(tokens, positions, context, mask)
        assert h.dtype == dtype
        return m.base_logits(h)

    with torch.inference_mode():
        full, reduced = logits(model, torch.float32), logits(half, torch.bfloat16)
    assert reduced.dtype == torch.float32  # sampling math is fp32 whatever the weights
    # A handful of bf16 roundings (2^-8 relative each) through one layer; measured 0.5% of the scale.
    assert (reduced - full).abs().max() < 0.02 * full.abs().max()


@pytest.mark.parametrize("head", ["gated", "rnn"])
def test_gated_and_rnn_heads_train(head):
    """The DSpark recipe trains every Markov head DeepSpec defines (vanilla is the default)."""
    first, last = _overfit(make(head=head), "l1")
    assert last < 0.75 * first, (first, last)
