"""probs_from_logits: temperature, top-k and top-p behave as vLLM's."""

from __future__ import annotations

import pytest
import torch

from dspark.sampling import probs_from_logits
from dspark.sampling_params import SamplingParams


def test_top_k_keeps_k_largest():
    logits = torch.tensor([1.0, 3.0, 2.0, 0.0])
    p = probs_from_logits(logits, SamplingParams(top_k=2))
    assert (p > 0).tolist() == [False, True, True, False]
    torch.testing.assert_close(p.sum(), torch.tensor(1.0))


def test_top_p_keeps_smallest_prefix_reaching_p():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log()
    assert (probs_from_logits(logits, SamplingParams(top_p=0.8)) > 0).tolist() == [True, True, False, False]
    assert (probs_from_logits(logits, SamplingParams(top_p=0.81)) > 0).tolist() == [True, True, True, False]
    assert (probs_from_logits(logits, SamplingParams(top_p=0.4)) > 0).tolist() == [True, False, False, False]


def test_temperature_sharpens():
    logits = torch.tensor([[1.0, 0.0]])
    cold = probs_from_logits(logits, SamplingParams(temperature=0.5))[0, 0]
    warm = probs_from_logits(logits, SamplingParams(temperature=2.0))[0, 0]
    assert cold > torch.sigmoid(torch.tensor(1.0)) > warm


def test_sample_rows_draws_from_each_rows_own_distribution():
    from scipy.stats import chisquare

    from dspark.sampling import sample_rows

    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0], [0.0, 3.0, 0.0, 0.0], [1.0, 1.0, 1.0, 9.0]])
    params = [
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.5, top_k=2),
        SamplingParams(temperature=0),
    ]
    gens = [torch.Generator().manual_seed(1), torch.Generator().manual_seed(2), None]
    counts = torch.zeros(2, 4)
    for _ in range(4000):
        tokens, rows = sample_rows(logits, params, gens)
        counts[0, tokens[0]] += 1
        counts[1, tokens[1]] += 1
        assert tokens[2] == 3 and rows[2] is None  # greedy rows take the argmax and carry no q
    for r in range(2):
        q = probs_from_logits(logits[r], params[r])
        keep = q > 0
        assert counts[r][~keep].sum() == 0  # never a token outside top-k
        assert chisquare(counts[r][keep].numpy(), (q[keep] * 4000).numpy()).pvalue > 1e-3
    # Seeded: the same generator state gives the same draw.
    a, _ = sample_rows(logits[:1], params[:1], [torch.Generator().manual_seed(9)])
    b, _ = sample_rows(logits[:1], params[:1], [torch.Generator().manual_seed(9)])
    assert torch.equal(a, b)


def test_every_accepted_parameter_gives_a_proper_distribution():
    """Extreme but valid settings on extreme logits: finite, non-negative, sums to 1, never empty."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.cat([torch.randn(3, 64, generator=gen) * 3e4, torch.full((1, 64), -3e38)])
    logits[0, :32] = float("-inf")  # masked tokens are fine as long as one is not
    for params in [
        SamplingParams(temperature=1e-5),
        SamplingParams(temperature=100.0),
        SamplingParams(temperature=1e-5, top_p=1e-9),
        SamplingParams(temperature=100.0, top_k=1),
        SamplingParams(temperature=0.7, top_p=0.5, top_k=3),
    ]:
        p = probs_from_logits(logits, params)
        assert bool(torch.isfinite(p).all()) and bool((p >= 0).all()), params
        torch.testing.assert_close(p.sum(-1), torch.ones(4))
        assert p[0, :32].sum() == 0  # -inf stays impossible


def test_logits_check_refuses_nan_and_inf_but_not_masked_tokens():
    import pytest

    from dspark.errors import RequestFailedError
    from dspark.request_failure import check_logits

    check_logits(torch.tensor([[0.0, float("-inf")], [1.0, 2.0]]))
    for bad in (float("nan"), float("inf")):
        with pytest.raises(RequestFailedError, match="not finite"):
            check_logits(torch.tensor([[0.0, 1.0], [bad, 2.0]]))
    with pytest.raises(RequestFailedError):
        check_logits(torch.full((1, 3), float("-inf")))


def test_sample_rows_gives_fp32_q_of_half_precision_logits():
    """A bf16 drafter's logits: q is exactly the fp32 softmax of those (rounded) logits, and the token
    drawn from it is the one an fp32 drafter with the same logits draws (the same uniform)."""
    from dspark.sampling import sample_rows

    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    params = [SamplingParams(temperature=0.7, top_p=0.9)] * 2 + [SamplingParams(temperature=0)]
    tokens, rows = sample_rows(logits, params, [torch.Generator().manual_seed(i) for i in range(3)])
    widened, wide_rows = sample_rows(
        logits.float(), params, [torch.Generator().manual_seed(i) for i in range(3)]
    )
    for r in range(2):
        assert rows[r].dtype == torch.float32
        assert torch.equal(rows[r], probs_from_logits(logits[r].float(), params[r]))
        assert torch.equal(rows[r], wide_rows[r])
    assert torch.equal(tokens, widened) and tokens[2] == logits[2].float().argmax()


@pytest.mark.parametrize("top_p", [1e-300, 5e-324, 1e-46, 1e-6])
def test_tiny_top_p_keeps_exactly_the_top_token(top_p):
    logits = torch.tensor([[0.5, 2.0, -1.0, 1.9], [3.0, 3.0 - 1e-3, 0.0, -5.0]])
    probs = probs_from_logits(logits, SamplingParams(temperature=0.7, top_p=top_p))
    assert torch.isfinite(probs).all()
    assert probs.argmax(-1).tolist() == [1, 0] and torch.equal(probs.max(-1).values, torch.ones(2))
