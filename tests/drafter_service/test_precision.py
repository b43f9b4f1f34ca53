"""The trainers' mixed precision: bf16 autocast only where the CPU multiplies bf16 natively."""

from __future__ import annotations

import pytest
import torch

from drafter_service.training.precision import bf16_autocast


@pytest.mark.parametrize(
    ("enabled", "amx", "avx512_bf16", "autocast"),
    [
        (True, True, False, True),
        (True, False, True, True),
        # An AVX2-only CPU emulates bf16 through a reference GEMM, many times slower than fp32: no autocast.
        (True, False, False, False),
        (False, True, True, False),
    ],
)
def test_autocast_only_where_enabled_and_bf16_is_native(monkeypatch, enabled, amx, avx512_bf16, autocast):
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16, raising=False)
    layer = torch.nn.Linear(4, 3)
    with bf16_autocast(enabled):
        assert torch.is_autocast_enabled("cpu") is autocast
        out = layer(torch.randn(2, 4))
    assert out.dtype == (torch.bfloat16 if autocast else torch.float32)
    assert not torch.is_autocast_enabled("cpu")
