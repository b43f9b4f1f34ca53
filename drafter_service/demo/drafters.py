"""The drafter half of `make models`: regenerate training data with the target, train every drafter
in one pass over the target's states, calibrate the DSpark confidences, save the checkpoints.

Shapes follow the demo target (hidden 256, 4 layers) and the build budget of 2 CPU cores.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from transformers import AutoConfig, AutoTokenizer

from drafter_service.calibration.rounds import run_rounds
from drafter_service.calibration.sts import calibration_report, fit_sts
from drafter_service.demo import corpus
from drafter_service.models.checkpoint import read_config, save_drafter
from drafter_service.models.config import DrafterConfig
from drafter_service.models.extras import save_extras
from drafter_service.training.regen import regenerate
from drafter_service.training.train import TrainSettings, train_drafters
from dspark import LLM, SamplingParams

GAMMA = 7
SERVING_TEMPERATURES = (0.0, 1.0)


@dataclass(frozen=True)
class DrafterBuild:
    prompts_per_domain: int = 320
    prompt_tokens: int = 64
    answer_tokens: int = 128
    steps: int = 360
    batch_size: int = 8
    # STS fits gamma temperatures on a grid: with too few rounds it overfits (edge temperatures).
    calibration_prompts_per_domain: int = 32
    calibration_new_tokens: int = 128


def drafter_configs(target_dir: Path, mask_token_id: int) -> dict[str, DrafterConfig]:
    """The four drafters of the issue plus the Markov ablation (DSpark trained with rank 0), each with
    the target's shape and RoPE as DeepSpec's `build_draft_config` copies them."""
    t = AutoConfig.from_pretrained(target_dir)
    layers = t.num_hidden_layers
    # Context fusion from shallow to deep, never the last layer (docs/ALGORITHM.md §2).
    block = dict(
        target_layer_ids=list(range(layers - 1)),
        mask_token_id=mask_token_id,
        num_hidden_layers=2,
        block_size=GAMMA,
        num_anchors=12,  # blocks trained per sequence per step
    )
    dspark = dict(enable_confidence_head=True, **block)
    return {
        "dspark": DrafterConfig.for_target(
            t,
            "dspark",
            markov_rank=64,
            markov_head_type="vanilla",
            confidence_head_with_markov=True,
            **dspark,
        ),
        "dflash": DrafterConfig.for_target(t, "dflash", **block),
        "dspark_r0": DrafterConfig.for_target(t, "dspark", markov_rank=0, **dspark),
        "eagle3": DrafterConfig.for_target(
            t, "eagle3", target_layer_ids=sorted({0, (layers - 1) // 2, layers - 2}), ttt_length=GAMMA
        ),
        "mtp1": DrafterConfig.for_target(t, "mtp1", target_layer_ids=[layers - 1], ttt_length=1),
    }


def calibration_prompts(tokenizer, per_domain: int, length: int) -> list[str]:
    """Even-indexed held-out prompts calibrate; bench/accept.py evaluates on the odd-indexed ones."""
    prompts = []
    for domain in corpus.DOMAINS:
        prompts += corpus.heldout_prompts(domain, 2 * per_domain, length, tokenizer)[0::2]
    return prompts


def calibrate(directory: Path, target_dir: Path, prompts: list[str], new_tokens: int) -> dict:
    """Fit STS at each serving temperature on held-out rounds; write them beside the checkpoint in
    SGLang's STS format (models/extras.py), the fit's report in the training provenance."""
    cfg = read_config(directory)
    reports = {}
    for temperature in SERVING_TEMPERATURES:
        params = SamplingParams(temperature=temperature, max_tokens=new_tokens, ignore_eos=True, seed=0)
        log = run_rounds(str(target_dir), "dspark", prompts, params, GAMMA, drafter_model=str(directory))
        temps = fit_sts(*log.tensors())
        cfg.sts_temperatures[temperature] = [round(t, 4) for t in temps]
        reports[str(temperature)] = calibration_report(*log.tensors(), temps)
    cfg.training["calibration_fit"] = reports
    save_extras(directory, cfg.kind, cfg.training, cfg.sts_temperatures)
    return reports


def build_drafters(target_dir: Path, out: Path, build: DrafterBuild = DrafterBuild()) -> None:
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    start = time.perf_counter()
    data = regenerate(
        str(target_dir), "train", build.prompts_per_domain, build.prompt_tokens, build.answer_tokens
    )
    data.save(out / "regenerated_train.json")  # token ids only; target states are never stored
    print(f"  regenerated {len(data.sequences)} answers in {time.perf_counter() - start:.1f}s", flush=True)
    configs = drafter_configs(target_dir, tokenizer.mask_token_id)
    settings = TrainSettings(steps=build.steps, batch_size=build.batch_size)
    models = train_drafters(str(target_dir), configs, data, settings, pad_id=tokenizer.eos_token_id)
    for name, model in models.items():
        save_drafter(model, out / name)
    prompts = calibration_prompts(tokenizer, build.calibration_prompts_per_domain, build.prompt_tokens)
    for name in ("dspark", "dspark_r0"):
        report = calibrate(out / name, target_dir, prompts, build.calibration_new_tokens)
        summary = ", ".join(f"T={t}: ECE {r['ece_raw']:.3f} -> {r['ece_sts']:.3f}" for t, r in report.items())
        print(f"  calibrated {name}: {summary}", flush=True)
    # Warm-load every drafter once so a broken checkpoint fails the build, not the first user.
    for name in models:
        LLM(
            str(target_dir),
            drafter=configs[name].kind,
            drafter_model=str(out / name),
            kv_cache_memory_mb=8,
        )
