"""probs_from_logits: temperature, top-k and top-p behave as vLLM's."""

from __future__ import annotations

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
