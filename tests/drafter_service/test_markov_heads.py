"""Each Markov head and the confidence head against a hand computation (vocabulary 3, rank 2, hidden 2),
with the equations of DeepSpec's markov_head.py / common.py (see drafter_service/models/markov.py)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from drafter_service.models.block import BlockDrafter
from drafter_service.models.config import DrafterConfig
from drafter_service.models.markov import MarkovHead

W1 = [[1.0, 0.0], [0.0, 1.0], [0.5, -1.0]]  # markov_w1: token -> e
W2 = [[1.0, 2.0], [0.0, -1.0], [3.0, 0.5]]  # markov_w2.weight [V, r]: bias_v = W2[v] . z
H0, H1 = [0.2, -0.4], [-0.3, 0.6]  # backbone outputs of slots 0 and 1


def sig(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def project(z: list[float]) -> list[float]:
    return [row[0] * z[0] + row[1] * z[1] for row in W2]


def head(kind: str) -> MarkovHead:
    m = MarkovHead(kind, 3, 2, 2).double()
    with torch.no_grad():
        m.markov_w1.weight.copy_(torch.tensor(W1))
        m.markov_w2.weight.copy_(torch.tensor(W2))
        if kind == "gated":
            m.gate_proj.weight.copy_(torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.0, -1.0, 1.0, 0.0]]))
            m.gate_proj.bias.copy_(torch.tensor([0.5, -0.5]))
        if kind == "rnn":  # columns: state (2), e (2), h (2); rows: gate (2), candidate (2), output (2)
            m.joint_proj.weight.copy_(
                torch.tensor(
                    [
                        [1.0, 0.0, 0.0, 0.0, 0.0, 0.0],
                        [0.0, 1.0, 0.0, 0.0, 0.0, 0.0],
                        [0.0, 0.0, 1.0, 0.0, 0.0, 0.0],
                        [0.0, 0.0, 0.0, 1.0, 0.0, 0.0],
                        [1.0, 0.0, 0.0, 0.0, 1.0, 0.0],
                        [0.0, 0.0, 1.0, 0.0, 0.0, 1.0],
                    ]
                )
            )
            m.joint_proj.bias.copy_(torch.tensor([0.1, -0.2, 0.0, 0.3, -0.1, 0.0]))
    return m


def by_hand(kind: str) -> list[list[float]]:
    """The Markov terms of slots 0 and 1, previous tokens 0 then 2."""
    e0, e1 = W1[0], W1[2]
    if kind == "vanilla":
        return [project(e0), project(e1)]
    if kind == "gated":  # g = sigmoid(gate_proj([h ; e])), z = g * e
        out = []
        for h, e in ((H0, e0), (H1, e1)):
            g = [sig(h[0] + e[1] + 0.5), sig(-h[1] + e[0] - 0.5)]
            out.append(project([g[0] * e[0], g[1] * e[1]]))
        return out
    state, out = [0.0, 0.0], []  # rnn: state starts at zero for the block
    for h, e in ((H0, e0), (H1, e1)):
        g = [sig(state[0] + 0.1), sig(state[1] - 0.2)]
        c = [math.tanh(e[0]), math.tanh(e[1] + 0.3)]
        o = [math.tanh(state[0] + h[0] - 0.1), math.tanh(e[0] + h[1])]
        out.append(project(o))  # the output of this step, from the state before it
        state = [g[i] * state[i] + (1 - g[i]) * c[i] for i in range(2)]
    return out


@pytest.mark.parametrize("kind", ["vanilla", "gated", "rnn"])
def test_markov_head_matches_the_hand_computation(kind):
    m = head(kind)
    expected = torch.tensor(by_hand(kind), dtype=torch.float32)
    h = torch.tensor([H0, H1], dtype=torch.float64)
    prev = torch.tensor([0, 2])
    with torch.no_grad():
        state = m.initial_state(h[0])
        steps = []
        for k in range(2):  # serving: one slot at a time
            z, state = m.step(prev[k], h[k], state)
            steps.append(m.bias(z))
        block = m.bias(m.block_latents(prev[None], h[None]))[0]  # training: the block teacher-forced
    torch.testing.assert_close(torch.stack(steps), expected)
    torch.testing.assert_close(block, expected)
    if kind == "rnn":  # the carried state matters: a stateless second step would differ
        stateless = m.bias(m.step(prev[1], h[1], m.initial_state(h[1]))[0])
        assert not torch.allclose(stateless, expected[1])


@pytest.mark.parametrize(
    "with_markov, expected", [(True, 0.2 + 0.4 + 0.25 - 2.0 + 0.25), (False, 0.2 + 0.4 + 0.25)]
)
def test_confidence_head_matches_the_hand_computation(with_markov, expected):
    cfg = DrafterConfig(
        "dspark",
        vocab_size=3,
        hidden_size=2,
        num_hidden_layers=1,
        num_attention_heads=1,
        num_key_value_heads=1,
        head_dim=2,
        intermediate_size=2,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1e4},
        max_position_embeddings=16,
        num_target_layers=1,
        target_layer_ids=[0],
        mask_token_id=1,
        num_anchors=1,
        markov_rank=2,
        markov_head_type="vanilla",
        enable_confidence_head=True,
        confidence_head_with_markov=with_markov,
    )
    model = BlockDrafter(cfg, nn.Embedding(3, 2), nn.Linear(2, 3, bias=False))
    with torch.no_grad():
        model.markov_head.markov_w1.weight.copy_(torch.tensor(W1))
        weight = [1.0, -1.0, 0.5, 2.0] if with_markov else [1.0, -1.0]  # logit = w . [h ; W1[prev]] + b
        model.confidence_head.proj.weight.copy_(torch.tensor([weight]))
        model.confidence_head.proj.bias.fill_(0.25)
        logit = model.confidence_logit(torch.tensor([H0]), torch.tensor([2]))
    torch.testing.assert_close(logit, torch.tensor([expected]))
