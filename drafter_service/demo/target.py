"""Pre-train the demo target: a small Qwen3-architecture causal LM on the stdlib corpus.

Shape (defaults of `TargetShape`): hidden 256, 4 layers, 4 query heads sharing 2 KV heads (GQA 2:1),
head_dim 64, SwiGLU 704, tied 8192-token embedding: 5.0M parameters. The size is the one that gave the
lowest held-out loss for the build's budget (about 6 minutes of this step on an idle 2-core machine,
bf16): in that time a model sees one or two million tokens, far below the ~20 tokens per parameter a
compute-optimal model would want, so a smaller model that sees more tokens ends lower. Trained for the
same time (`bench/target_sweep.py`): 11.0M (hidden 384, 5 layers, 1.06M tokens) held-out perplexity
121 / 326 (code / prose); 6.5M (256, 6 layers, 1.33M tokens) 116 / 316; 5.0M (256, 4 layers, 1.74M
tokens) 93 / 250; 3.1M (192, 4 layers, 2.23M tokens) 106 / 288. Four layers still give drafters
shallow, middle and deep features to read.
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from drafter_service.training.precision import bf16_autocast


@dataclass(frozen=True)
class TargetShape:
    """Architecture hyper-parameters of the target."""

    hidden_size: int = 256
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 64
    intermediate_size: int = 704
    max_position_embeddings: int = 2048
    rope_theta: float = 10000.0


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation hyper-parameters; ``steps`` (not wall time) fixes the result, so runs reproduce."""

    # 850 x 4 x 512 = 1.74M tokens, ~6.4 min on 2 idle cores (0.42 s a step). Small batches: in this
    # token-starved regime more updates beat less noisy ones (measured: 2048 tokens/step reached lower loss
    # than 4096 per token seen).
    steps: int = 850
    batch_size: int = 4
    seq_len: int = 512  # Longer than demo prompts plus generations, so serving stays in-distribution.
    lr: float = 3e-3  # High for a tiny model and a few hundred steps; warm-up keeps the start stable.
    min_lr_ratio: float = 0.1
    warmup_steps: int = 25
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    seed: int = 0
    # bf16 autocast (fp32 master weights) about doubles CPU throughput where the CPU has bf16 units,
    # i.e. twice the tokens in the same budget; weights are saved in float32 either way. Elsewhere
    # (emulated bf16) training runs in fp32 (training/precision.py).
    bf16: bool = True
    eval_tokens: int = 32768  # Per domain; enough for a stable perplexity, cheap to compute.
    # Safety net only: stopping by the clock makes the weights depend on the machine's speed.
    max_wall_s: float | None = None


def qwen3_config(shape: TargetShape, tokenizer: PreTrainedTokenizerFast) -> Qwen3Config:
    """The Hugging Face config for ``shape`` with the tokenizer's vocabulary and special ids."""
    eos = tokenizer.eos_token_id
    return Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads,
        head_dim=shape.head_dim,
        max_position_embeddings=shape.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": shape.rope_theta},
        tie_word_embeddings=True,
        use_sliding_window=False,
        bos_token_id=eos,
        eos_token_id=eos,
        pad_token_id=eos,
        dtype="float32",
    )


def tokenize(tokenizer: PreTrainedTokenizerFast, texts: Sequence[str]) -> list[np.ndarray]:
    """Token ids of each text, without special tokens (the Rust backend, batched: seconds, not minutes)."""
    encodings = tokenizer.backend_tokenizer.encode_batch(list(texts), add_special_tokens=False)
    return [np.asarray(e.ids, dtype=np.int64) for e in encodings]


def pack(docs: Sequence[np.ndarray], eos_id: int, seq_len: int, seed: int | None) -> torch.Tensor:
    """Documents joined by eos and cut into ``[n, seq_len]`` rows; shuffled first when ``seed`` is given.

    Shuffling documents (not files in directory order) mixes both domains and all packages into every
    batch; the remainder shorter than ``seq_len`` is dropped.
    """
    order = list(range(len(docs)))
    if seed is not None:
        random.Random(seed).shuffle(order)
    eos = np.asarray([eos_id], dtype=np.int64)
    stream = np.concatenate([part for i in order for part in (docs[i], eos)]) if docs else eos[:0]
    n = len(stream) // seq_len
    return torch.from_numpy(stream[: n * seq_len].reshape(n, seq_len).copy())


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up to ``cfg.lr``, then cosine decay to ``cfg.lr * cfg.min_lr_ratio``."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    cosine = 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return cfg.lr * (cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * cosine)


@torch.no_grad()
def perplexity(model: Qwen3ForCausalLM, rows: torch.Tensor, batch_size: int) -> float:
    """Per-token perplexity of ``rows`` in float32, the precision the engine serves in."""
    model.eval()
    total_nll, total_tokens = 0.0, 0
    for i in range(0, len(rows), batch_size):
        batch = rows[i : i + batch_size]
        loss = model(input_ids=batch, labels=batch).loss
        tokens = batch.numel() - len(batch)  # Each row predicts all but its first token.
        total_nll += loss.item() * tokens
        total_tokens += tokens
    model.train()
    return math.exp(total_nll / max(1, total_tokens))


def _optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    # Norm gains are not decayed: shrinking them towards 0 only fights the normalisation.
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8)


def train_target(
    tokenizer: PreTrainedTokenizerFast,
    train_texts: Sequence[str],
    heldout_texts: Mapping[str, Sequence[str]],
    out_dir: Path,
    shape: TargetShape = TargetShape(),
    cfg: TrainConfig = TrainConfig(),
    progress: bool = True,
) -> dict:
    """Train the target, save it (float32 safetensors + tokenizer + training.json) to ``out_dir``.

    ``heldout_texts`` maps a domain name to its held-out documents; the report (also returned) holds
    each domain's held-out perplexity, the per-step losses, token count and wall time.
    """
    start = time.perf_counter()
    torch.manual_seed(cfg.seed)
    eos = tokenizer.eos_token_id
    rows = pack(tokenize(tokenizer, train_texts), eos, cfg.seq_len, seed=cfg.seed)
    if len(rows) == 0:
        raise ValueError(f"training texts give fewer than seq_len={cfg.seq_len} tokens")

    model = Qwen3ForCausalLM(qwen3_config(shape, tokenizer)).float()
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    optimizer = _optimizer(model, cfg)
    generator = torch.Generator().manual_seed(cfg.seed)
    order = torch.randperm(len(rows), generator=generator)
    cursor, epochs = 0, 0

    losses: list[float] = []
    stopped_early = False
    bar = tqdm(range(cfg.steps), desc=f"target {n_params / 1e6:.1f}M", disable=not progress, unit="step")
    for step in bar:
        if cursor + cfg.batch_size > len(order):  # Next epoch: a fresh permutation of the same rows.
            order = torch.randperm(len(rows), generator=generator)
            cursor, epochs = 0, epochs + 1
        batch = rows[order[cursor : cursor + cfg.batch_size]]
        cursor += cfg.batch_size
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, cfg)
        with bf16_autocast(cfg.bf16):
            loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        bar.set_postfix(loss=f"{losses[-1]:.3f}", lr=f"{lr_at(step, cfg):.1e}")
        if cfg.max_wall_s is not None and time.perf_counter() - start > cfg.max_wall_s:
            stopped_early = True
            break
    train_seconds = time.perf_counter() - start  # Includes tokenizing and packing the corpus (seconds).

    heldout_ppl = {}
    for domain, texts in heldout_texts.items():
        eval_rows = pack(tokenize(tokenizer, texts), eos, cfg.seq_len, seed=None)
        eval_rows = eval_rows[: max(1, cfg.eval_tokens // cfg.seq_len)]
        heldout_ppl[domain] = perplexity(model, eval_rows, cfg.batch_size) if len(eval_rows) else None

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    # Transformers 5 writes safetensors only; the weights never go through pickle.
    model.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))
    report = {
        "shape": asdict(shape),
        "train": asdict(cfg),
        "parameters": n_params,
        "steps_done": len(losses),
        "stopped_early": stopped_early,
        "tokens_trained": len(losses) * cfg.batch_size * cfg.seq_len,
        "train_tokens_available": int(rows.numel()),
        "epochs_completed": epochs,
        "heldout_perplexity": heldout_ppl,
        "train_seconds": round(train_seconds, 1),
        "wall_seconds": round(time.perf_counter() - start, 1),
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "losses": [round(x, 4) for x in losses],
    }
    (out_dir / "training.json").write_text(json.dumps(report, indent=2) + "\n")
    return report
