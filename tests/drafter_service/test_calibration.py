"""Sequential temperature scaling lowers ECE on miscalibrated confidences; metrics are exact."""

from __future__ import annotations

import torch

from drafter_service.calibration.sts import auc, brier, calibration_report, ece, fit_sts


def synthetic_rounds(n: int = 4000, gamma: int = 4, seed: int = 0):
    """True per-slot acceptance sigmoid(z); the reported logits are 3z (overconfident)."""
    gen = torch.Generator().manual_seed(seed)
    z = torch.randn(n, gamma, generator=gen) * 1.5 + 0.5
    accept = torch.rand(n, gamma, generator=gen) < torch.sigmoid(z)
    accepted = torch.where(accept.all(1), gamma, (~accept).float().argmax(1))
    return 3 * z, accepted, torch.full((n,), gamma)


def test_sts_lowers_ece_on_held_out_data():
    logits, accepted, verified = synthetic_rounds()
    temps = fit_sts(logits, accepted, verified)
    assert all(2.0 < t < 4.5 for t in temps[:2]), temps  # recovers roughly the 3x overconfidence
    held_out = synthetic_rounds(seed=1)
    report = calibration_report(*held_out, temps)
    assert report["ece_raw"] > 0.05
    assert report["ece_sts"] < 0.02 and report["ece_sts"] < report["ece_raw"] / 3
    assert report["brier"] < report["brier_raw"]


def test_metrics_on_hand_computed_cases():
    probs = torch.tensor([0.1, 0.1, 0.9, 0.9])
    labels = torch.tensor([0, 1, 1, 1])
    # Bin 0.1: mean 0.1 vs 0.5; bin 0.9: 0.9 vs 1.0 -> (2 * 0.4 + 2 * 0.1) / 4.
    assert abs(ece(probs, labels) - 0.25) < 1e-6
    assert abs(brier(probs, labels) - (0.01 + 0.81 + 0.01 + 0.01) / 4) < 1e-6
    assert auc(torch.tensor([0.1, 0.4, 0.35, 0.8]), torch.tensor([0, 0, 1, 1])) == 0.75
    assert auc(torch.tensor([0.5, 0.5]), torch.tensor([0, 1])) == 0.5
