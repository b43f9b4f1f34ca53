"""Training several drafters for one target at once: each batch's target states are computed once,
on the fly, and every drafter takes its own step on them (docs/ALGORITHM.md §5: AdamW, lr 6e-4, no
weight decay, 4% warm-up then cosine, gradient clip 1.0). Seeded, so a rerun gives the same weights.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass

import torch
from tqdm import tqdm

from drafter_service.models.checkpoint import build_drafter
from drafter_service.models.config import DrafterConfig
from drafter_service.training.ar_loss import ar_loss
from drafter_service.training.block_loss import block_loss
from drafter_service.training.precision import bf16_autocast
from drafter_service.training.regen import Regenerated
from drafter_service.training.target_states import FrozenTarget


@dataclass(frozen=True)
class TrainSettings:
    steps: int = 400
    batch_size: int = 8
    lr: float = 6e-4
    warmup_fraction: float = 0.04
    grad_clip: float = 1.0
    positions_per_seq: int = 48  # autoregressive drafters: loss positions per sequence per step
    # A 7-step training-time test costs ~7 forwards of the whole sequence: the autoregressive
    # drafters see this many sequences of each batch so their step costs what a block drafter's does.
    ar_batch_size: int = 4
    # bf16 autocast (fp32 master weights) about doubles CPU throughput where bf16 units exist; elsewhere
    # fp32 (training/precision.py).
    bf16: bool = True
    seed: int = 0


def lr_factor(step: int, settings: TrainSettings) -> float:
    warmup = max(1, int(settings.warmup_fraction * settings.steps))
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, settings.steps - warmup)
    return 0.5 * (1 + math.cos(math.pi * progress))


def train_drafters(
    target_dir: str,
    configs: dict[str, DrafterConfig],
    data: Regenerated,
    settings: TrainSettings,
    pad_id: int,
) -> dict[str, torch.nn.Module]:
    torch.manual_seed(settings.seed)
    target = FrozenTarget(target_dir, {i for c in configs.values() for i in c.target_layer_ids})
    models = {name: build_drafter(cfg, target.embed, target.lm_head) for name, cfg in configs.items()}
    optimizers = {
        name: torch.optim.AdamW(m.parameters(), lr=settings.lr, weight_decay=0.0)
        for name, m in models.items()
    }
    schedulers = {
        name: torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, settings))
        for name, opt in optimizers.items()
    }
    generators = {name: torch.Generator().manual_seed(settings.seed + i) for i, name in enumerate(models)}
    order = list(range(len(data.sequences)))
    rng = random.Random(settings.seed)
    rng.shuffle(order)
    history: dict[str, list[float]] = {name: [] for name in models}
    start = time.perf_counter()
    bar = tqdm(range(settings.steps), desc="drafters")
    for step in bar:
        picks = [order[(step * settings.batch_size + i) % len(order)] for i in range(settings.batch_size)]
        tokens, lengths, answer_starts = data.batch(picks, pad_id)
        with bf16_autocast(settings.bf16):
            states = target.states(tokens, lengths)
        shown = {}
        for name, model in models.items():
            model.train()
            with bf16_autocast(settings.bf16):
                if model.cfg.is_block:
                    loss, _ = block_loss(
                        model,
                        tokens,
                        lengths,
                        answer_starts,
                        states,
                        model.cfg.num_anchors,  # blocks trained per sequence per step
                        generators[name],
                    )
                else:
                    a = settings.ar_batch_size
                    loss, _ = ar_loss(
                        model,
                        tokens[:a],
                        lengths[:a],
                        answer_starts[:a],
                        states.rows(a),
                        settings.positions_per_seq,
                        generators[name],
                    )
            optimizers[name].zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), settings.grad_clip)
            optimizers[name].step()
            schedulers[name].step()
            history[name].append(loss.item())
            shown[name] = f"{history[name][-1]:.3f}"
        bar.set_postfix(shown)
    wall = time.perf_counter() - start
    for name, model in models.items():
        model.eval()
        tail = history[name][-20:]
        model.cfg.training = {
            "steps": settings.steps,
            "batch_size": settings.batch_size,
            "lr": settings.lr,
            "sequences": len(data.sequences),
            "seed": settings.seed,
            "wall_s_all_drafters": round(wall, 1),
            "final_loss": round(sum(tail) / len(tail), 4),
            "first_loss": round(history[name][0], 4),
        }
    return models
