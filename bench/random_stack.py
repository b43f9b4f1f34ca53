"""A random-weight stack with the demo's exact shapes, for timing the engine and drafter without
`make models`: the demo tokenizer, an untrained target (TargetShape) and an untrained DSpark drafter
(the demo's drafter config) beside it, as `make models` lays them out.

Only timing means anything on it: with the fixed scheduler every round verifies all drafted tokens, so
a round's work does not depend on the weights; acceptance, tau and output text from it are noise.

    python bench/random_stack.py --out /tmp/ds16/stack   # about a minute
    python bench/drafter_profile.py --model /tmp/ds16/stack/target --code /tmp/ds_before .
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from transformers import Qwen3ForCausalLM

from drafter_service.demo import corpus
from drafter_service.demo.drafters import drafter_configs
from drafter_service.demo.target import TargetShape, qwen3_config
from drafter_service.demo.tokenizer import save_tokenizer, train_tokenizer
from drafter_service.models.checkpoint import build_drafter, save_drafter


def build(out: Path, seed: int = 0) -> None:
    torch.manual_seed(seed)
    target_dir = out / "target"
    tokenizer = train_tokenizer(corpus.train_documents())
    target = Qwen3ForCausalLM(qwen3_config(TargetShape(), tokenizer))
    target.save_pretrained(target_dir)
    save_tokenizer(tokenizer, target_dir)
    cfg = drafter_configs(target_dir, tokenizer.mask_token_id)["dspark"]
    save_drafter(build_drafter(cfg, target.model.embed_tokens, target.lm_head), out / "drafters" / "dspark")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    build(args.out)
    print(f"random demo-shaped stack in {args.out} (timing only)")


if __name__ == "__main__":
    main()
