"""Greedy identity in half precision: the rule shared by the bf16 tests and scripts/gpu_smoke.py.

In fp32 a speculative run is token-identical to the target alone, and the fp32 tests demand exactly
that. In bf16 or fp16 it is identical up to the first position where the target itself cannot tell
its top two tokens apart: a verify forward of k tokens and a decode forward of one reduce in
different orders (and differently batched matmuls pick different kernels), so the same logits come
out a few rounding units apart, and an argmax whose top-2 gap is smaller than that may flip. After
such a flip the two runs continue from different prefixes, so nothing after it can be compared.

The rule, per prompt: compare the two generated sequences; at the first position where they differ,
run the target alone on prompt + common prefix (a plain forward with transformers, in the same
dtype: a third reduction order, independent of our runner) and require that
  (a) the two diverging tokens are its top two, in either order, and
  (b) their logit gap is at most `near_tie_bound(top1, dtype)` (below).
Divergences must also be rare: an engine that emitted anything but the target's argmax (a draft
accepted unchecked, a verify row read at the wrong position, a drafter's state leaking into the
target's) would diverge on most prompts, mostly at tokens that are not the runner-up.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Spacing of the format at 1.0 (2^-7 for bf16's 8-bit significand, 2^-10 for fp16's 11 bits).
EPSILON = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10, torch.float32: 0.0}
# How many rounding units (EPSILON x |top logit|) the top-2 gap may be. Measured on the tiny test
# target (3 layers, hidden 64, bf16 on the CPU, 20 sequences of 40 tokens): a prefill and the same
# tokens run as verify chunks of 5 give logits at most 2.7 units apart (our prefill and transformers'
# agree exactly). Both of a top-2 pair can move, in opposite directions, so an argmax flips only where
# the gap is within twice that, 5.4 units; 8 leaves room for other kernels (GPUs, fp16). The bound is
# loose on tiny random models, whose top two are within 8 units at about 40% of positions: what makes
# the rule sharp is (a), a wrong token is almost never exactly the runner-up, and the rarity limit,
# which a systematic error (tokens accepted unchecked) breaks at once.
ROUNDING_UNITS = 8


def near_tie_bound(top1: float, dtype: torch.dtype) -> float:
    """Largest top-2 gap a change of reduction order can flip: ROUNDING_UNITS units at |top1|."""
    return ROUNDING_UNITS * EPSILON[dtype] * max(abs(top1), 1.0)


@dataclass(frozen=True)
class Divergence:
    prompt: int  # index of the prompt
    position: int  # index into the generated tokens
    expected: int  # the target alone's token
    got: int  # the speculative run's token
    gap: float  # the target's top-2 logit gap there (plain forward)
    bound: float
    top2: tuple[int, int]

    @property
    def near_tie(self) -> bool:
        return {self.expected, self.got} == set(self.top2) and self.gap <= self.bound


def first_divergence(expected: list[int], got: list[int]) -> int | None:
    """First index where the two sequences differ (a length difference counts), else None."""
    for i, (a, b) in enumerate(zip(expected, got)):
        if a != b:
            return i
    return None if len(expected) == len(got) else min(len(expected), len(got))


class PlainTarget:
    """The target alone, in transformers, for one logits row of a prefix."""

    def __init__(self, path: str, dtype: torch.dtype, device: str) -> None:
        from transformers import AutoModelForCausalLM

        self.dtype, self.device = dtype, device
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()

    @torch.inference_mode()
    def last_logits(self, token_ids: list[int]) -> torch.Tensor:
        ids = torch.tensor([token_ids], device=self.device)
        return self.model(ids).logits[0, -1].float().cpu()


def divergences(
    target: PlainTarget, prompts: list[list[int]], expected: list[list[int]], got: list[list[int]]
) -> list[Divergence]:
    """Every prompt's first divergence (none where the runs agree), with the target's top-2 there."""
    found = []
    for i, (prompt, want, have) in enumerate(zip(prompts, expected, got)):
        pos = first_divergence(want, have)
        if pos is None:
            continue
        logits = target.last_logits(prompt + want[:pos])
        top = torch.topk(logits, 2)
        top1, top2 = top.values.tolist()
        found.append(
            Divergence(
                prompt=i,
                position=pos,
                expected=want[pos] if pos < len(want) else -1,
                got=have[pos] if pos < len(have) else -1,
                gap=top1 - top2,
                bound=near_tie_bound(top1, target.dtype),
                top2=tuple(top.indices.tolist()),
            )
        )
    return found


def check(found: list[Divergence], num_prompts: int, max_diverging: int) -> str | None:
    """None when the rule holds; else what broke it, for an assertion message or a summary line."""
    bad = [d for d in found if not d.near_tie]
    if bad:
        return f"divergence at a position that is no near-tie: {bad[0]}"
    if len(found) > max_diverging:
        return f"{len(found)} of {num_prompts} prompts diverge (at most {max_diverging} allowed): {found}"
    return None
