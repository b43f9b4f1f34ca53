"""BlockSampler: a round's slots drawn with each request's own params and generator, grouped once."""

from __future__ import annotations

import torch

from dspark.block_sampler import BlockSampler
from dspark.sampling import inverse_cdf, probs_from_logits
from dspark.sampling_params import SamplingParams

V = 50


def test_each_row_is_drawn_from_its_own_q_with_its_own_uniforms():
    hot = SamplingParams(temperature=1.3)
    nucleus = SamplingParams(temperature=0.7, top_k=10, top_p=0.9, seed=4, max_tokens=99)
    same_shape = SamplingParams(temperature=0.7, top_k=10, top_p=0.9, seed=5)  # joins nucleus' group
    params = [SamplingParams(temperature=0), nucleus, hot, same_shape]
    num_slots = [3, 2, 3, 3]
    sampler = BlockSampler(
        params, [None] + [torch.Generator().manual_seed(s) for s in (1, 2, 3)], num_slots, "cpu"
    )
    assert sorted(g.rows for g in sampler.groups) == [[1, 3], [2]]
    logits = torch.randn(3, 4, V, generator=torch.Generator().manual_seed(0)) * 3
    tokens = torch.stack([sampler.draw(logits[k], k) for k in range(3)], 1)
    q_of = {i: q[j] for rows, q in sampler.probs() for j, i in enumerate(rows)}
    assert sorted(q_of) == [1, 2, 3]
    assert tokens[0].tolist() == logits[:, 0].argmax(-1).tolist()
    for i, seed in ((1, 1), (2, 2), (3, 3)):
        uniforms = torch.rand(num_slots[i], generator=torch.Generator().manual_seed(seed))
        for k in range(num_slots[i]):
            q = probs_from_logits(logits[k, i], params[i])
            torch.testing.assert_close(q_of[i][k], q, rtol=0, atol=0)
            assert int(tokens[i, k]) == int(inverse_cdf(q[None], uniforms[k : k + 1]))
            assert q[tokens[i, k]] > 0


def test_one_shape_for_every_row_needs_no_index():
    params = [SamplingParams(temperature=1.0, seed=s) for s in range(3)]
    sampler = BlockSampler(params, [torch.Generator().manual_seed(s) for s in range(3)], [2, 2, 2], "cpu")
    assert len(sampler.groups) == 1 and sampler.groups[0].index is None
    logits = torch.randn(3, V)
    tokens = sampler.draw(logits, 0)
    assert tokens.shape == (3,) and all(
        float(sampler.probs()[0][1][i, 0, t]) > 0 for i, t in enumerate(tokens)
    )
