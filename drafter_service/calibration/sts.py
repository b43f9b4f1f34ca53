"""Confidence calibration: sequential temperature scaling and the metrics it is judged by
(docs/ALGORITHM.md §4).

Inputs are rounds observed at the serving temperature: raw confidence logits c^_1..c^_gamma of the
verified slots and how many of them the target accepted. The survival estimate of slot k is
a_k = prod_{i<=k} sigmoid(c^_i / T_i); its label is "slots 1..k were all accepted".
"""

from __future__ import annotations

import math

import torch

GRID = sorted(set(torch.logspace(math.log10(0.05), math.log10(20.0), 256).tolist()) | {1.0})


def ece(probs: torch.Tensor, labels: torch.Tensor, bins: int = 20) -> float:
    """Expected calibration error with equal-width bins."""
    if len(probs) == 0:
        return 0.0
    idx = (probs * bins).long().clamp(max=bins - 1)
    total = 0.0
    for b in range(bins):
        sel = idx == b
        if sel.any():
            total += float(sel.sum()) * abs(float(probs[sel].mean()) - float(labels[sel].float().mean()))
    return total / len(probs)


def brier(probs: torch.Tensor, labels: torch.Tensor) -> float:
    return float(((probs - labels.float()) ** 2).mean()) if len(probs) else 0.0


def auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """Area under the ROC curve (the rank statistic, ties counted half)."""
    labels = labels.bool()
    pos, neg = scores[labels], scores[~labels]
    if len(pos) == 0 or len(neg) == 0:
        return float("nan")
    ranks = torch.empty(len(scores))
    order = scores.argsort()
    ranks[order] = torch.arange(1, len(scores) + 1, dtype=torch.float)
    for value in scores.unique():  # average ranks over ties
        tie = scores == value
        ranks[tie] = ranks[tie].mean()
    return float((ranks[labels].sum() - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg)))


def survival_and_labels(
    logits: torch.Tensor, accepted: torch.Tensor, verified: torch.Tensor, temperatures: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """For rounds that verified >= k slots: a_k under `temperatures` and the label (accepted >= k)."""
    rows = verified >= k
    a = torch.sigmoid(logits[rows, :k] / temperatures[:k]).prod(dim=1)
    return a, accepted[rows] >= k


def fit_sts(logits: torch.Tensor, accepted: torch.Tensor, verified: torch.Tensor) -> list[float]:
    """T_1..T_gamma chosen in order, each minimising the ECE of survival at its position."""
    gamma = logits.shape[1]
    temps = torch.ones(gamma)
    for k in range(1, gamma + 1):
        if int((verified >= k).sum()) == 0:
            break
        best, best_t = float("inf"), 1.0
        for t in GRID:
            temps[k - 1] = t
            err = ece(*survival_and_labels(logits, accepted, verified, temps, k))
            if err < best - 1e-12:
                best, best_t = err, t
        temps[k - 1] = best_t
    return temps.tolist()


def calibration_report(
    logits: torch.Tensor, accepted: torch.Tensor, verified: torch.Tensor, temperatures: list[float]
) -> dict:
    """ECE / AUC / Brier of survival over all (round, position) pairs, raw and with the given STS."""
    gamma = logits.shape[1]
    raw_a, sts_a, labels = [], [], []
    for k in range(1, gamma + 1):
        a, y = survival_and_labels(logits, accepted, verified, torch.ones(gamma), k)
        s, _ = survival_and_labels(logits, accepted, verified, torch.tensor(temperatures), k)
        raw_a.append(a)
        sts_a.append(s)
        labels.append(y)
    raw, sts, y = torch.cat(raw_a), torch.cat(sts_a), torch.cat(labels)
    return {
        "ece_raw": ece(raw, y),
        "ece_sts": ece(sts, y),
        "auc": auc(sts, y),
        "brier": brier(sts, y),
        "brier_raw": brier(raw, y),
        "pairs": len(y),
    }
