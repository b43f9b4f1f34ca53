"""Mixed precision shared by the target's and the drafters' trainers."""

from __future__ import annotations

import contextlib

import torch


def bf16_autocast(enabled: bool) -> contextlib.AbstractContextManager:
    """bf16 autocast on CPU when enabled (both trainers' default), else a no-op context."""
    return torch.autocast("cpu", dtype=torch.bfloat16) if enabled else contextlib.nullcontext()
