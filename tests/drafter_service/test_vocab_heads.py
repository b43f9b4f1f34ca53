"""VocabHeads: the block drafter's LM head and Markov term as serving computes them."""

from __future__ import annotations

import pytest
import torch
from test_block_drafter import D, V, make

from drafter_service.runtime.vocab_heads import VocabHeads, compute_dtype, head_dtype, native_bf16


def test_explicit_head_dtypes_are_kept_and_unknown_ones_refused_by_name():
    cpu = torch.device("cpu")
    assert head_dtype("float32", torch.bfloat16, cpu) == torch.float32
    assert head_dtype("bfloat16", torch.float32, cpu) == torch.bfloat16
    assert head_dtype("auto", torch.float32, torch.device("meta")) == torch.float32  # no native bf16 there
    with pytest.raises(ValueError, match="head_dtype"):
        head_dtype("float16", torch.float32, cpu)


def test_markov_term_is_added_in_one_product_as_the_model_adds_it():
    model = make()
    heads = VocabHeads(model, torch.float32)
    assert heads.weight.data_ptr() == model.shared[1].weight.data_ptr()  # no copy in the model's dtype
    gen = torch.Generator().manual_seed(0)
    h, prev = torch.randn(3, D, generator=gen), torch.tensor([2, 7, 11])
    base = heads.base_logits(h)
    torch.testing.assert_close(base, model.base_logits(h), rtol=0, atol=0)
    z, _ = model.markov_head.step(prev, h, None)
    with_markov = heads.with_markov(base, z)
    torch.testing.assert_close(with_markov, base + model.markov_head.bias(z))
    assert with_markov.shape == (3, V) and with_markov.dtype == torch.float32
    assert not torch.equal(with_markov, base)
    assert heads.with_markov(base, None) is base  # DFlash: no Markov term


@pytest.mark.parametrize(
    ("amx", "avx512_bf16", "native"),
    [(True, False, True), (False, True, True), (False, False, False)],
)
def test_auto_takes_bf16_on_cpus_with_native_bf16_products(monkeypatch, amx, avx512_bf16, native):
    """AMX tiles or AVX-512 BF16 dot products (an EPYC Zen 4 has the second only) multiply bf16
    natively; without either, bf16 is emulated and slower than fp32, so auto keeps the model's dtype."""
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16, raising=False)
    cpu = torch.device("cpu")
    assert native_bf16(cpu) is native
    assert head_dtype("auto", torch.float32, cpu) == (torch.bfloat16 if native else torch.float32)

    # The layers: an fp32 drafter is halved there, a half-precision one left alone, a name checked.
    assert compute_dtype("auto", torch.float32, cpu) == (torch.bfloat16 if native else torch.float32)
    assert compute_dtype("auto", torch.float16, cpu) == torch.float16
    assert compute_dtype("float32", torch.bfloat16, cpu) == torch.float32
    with pytest.raises(ValueError, match="compute_dtype"):
        compute_dtype("fp8", torch.float32, cpu)
