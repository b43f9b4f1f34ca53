"""Handing a round's results to the engine, which verifies and schedules on the CPU in fp32."""

from __future__ import annotations

import torch


def to_host(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """The same tensors as fp32 on the CPU, in one device-to-host copy (one sync) rather than one each."""
    if not tensors:
        return []
    if all(t.device.type == "cpu" for t in tensors):
        return [t.float() for t in tensors]
    flat = torch.cat([t.float().reshape(-1) for t in tensors]).cpu()
    return [part.view(t.shape) for part, t in zip(flat.split([t.numel() for t in tensors]), tensors)]
