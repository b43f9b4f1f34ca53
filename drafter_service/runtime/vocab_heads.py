"""The block drafter's two vocabulary-sized products, computed the way that is fastest where it serves.

A round computes base logits U = lm_head(h) for every slot [R, gamma, V] and, slot by slot, the
Markov term W2 . z_k [R, V]. On a CPU both are bound by streaming the weight matrix (the LM head is
V x d: 12.6 MB in fp32 for the demo), not by arithmetic, so:

- the LM head runs from a bf16 copy of the (shared, frozen) target weights where the device
  multiplies bf16 natively (CUDA; a CPU with AMX tiles or AVX-512 BF16 dot products, through
  oneDNN): half the bytes, and measured on this project's CPUs 2.5x faster for a 7-slot block and 3x
  for 8 requests' blocks (AMX), 2-3.5x (an AVX-512 BF16 EPYC, weights out of cache); elsewhere it
  stays in the model's dtype (bf16 emulated in fp32 units is slower than fp32);
- the Markov term is added in the same call that computes it (`addmm` into the base logits, with W2
  transposed once at load) instead of a product and then a sum.

Neither touches losslessness: the drafter may propose from any distribution, q is fp32 and is
exactly the distribution the token is drawn from (BlockSampler), and verification corrects for
whatever q is. They only change the drafter's logits by rounding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from drafter_service.models.block import BlockDrafter

NAMED_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def native_bf16(device: torch.device) -> bool:
    """Whether bf16 matrix products beat fp32 on this device."""
    if device.type == "cuda":
        return True
    if device.type != "cpu":
        return False
    # torch's own CPU capability probes: AMX tiles, or AVX-512 with its BF16 dot-product instructions.
    probes = ("_is_amx_tile_supported", "_is_avx512_bf16_supported")
    return any(getattr(torch.cpu, name, lambda: False)() for name in probes)


def head_dtype(choice: str, model_dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The LM head's dtype for `choice` ("auto", "float32" or "bfloat16")."""
    if choice == "auto":
        return torch.bfloat16 if native_bf16(device) else model_dtype
    return _named(choice, "head_dtype")


def compute_dtype(choice: str, model_dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The draft layers' dtype for `choice`: "auto" halves an fp32 drafter where bf16 is native (its
    small products run ~2x faster there: 7 rows of 384 x 1024 in 50 us against 112 us on this
    project's EPYC) and leaves a half-precision one as it is."""
    if choice == "auto":
        return torch.bfloat16 if model_dtype == torch.float32 and native_bf16(device) else model_dtype
    return _named(choice, "compute_dtype")


def _named(choice: str, option: str) -> torch.dtype:
    if choice not in NAMED_DTYPES:
        raise ValueError(f"{option} must be 'auto' or one of {sorted(NAMED_DTYPES)}, got {choice!r}")
    return NAMED_DTYPES[choice]


class VocabHeads:
    def __init__(self, model: BlockDrafter, dtype: torch.dtype) -> None:
        _, lm_head = model.shared
        self.weight = lm_head.weight.detach().to(dtype)  # the model's own tensor when dtypes agree
        self.bias = None if lm_head.bias is None else lm_head.bias.detach().to(dtype)
        head = model.markov_head
        # [r, V] fp32: addmm then adds into the fp32 base logits directly.
        self.markov_w2_t = None if head is None else head.markov_w2.weight.detach().t().float().contiguous()

    @property
    def dtype(self) -> torch.dtype:
        return self.weight.dtype

    def base_logits(self, h: torch.Tensor) -> torch.Tensor:
        """U = lm_head(h), fp32, for hidden states h [..., d]."""
        return F.linear(h.to(self.weight.dtype), self.weight, self.bias).float()

    def with_markov(self, base: torch.Tensor, z: torch.Tensor | None) -> torch.Tensor:
        """U_k + W2 . z_k [R, V] (a new tensor) from base logits U_k [R, V] and latents z_k [R, r]."""
        if z is None:
            return base
        return torch.addmm(base, z.float(), self.markov_w2_t)
