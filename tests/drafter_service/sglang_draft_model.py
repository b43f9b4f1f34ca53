"""Load drafter checkpoints into SGLang 0.5.23's OWN DSpark draft model on CPU and write what it holds.

    python tests/drafter_service/sglang_draft_model.py TARGET_DIR DRAFTER_DIR OUT.safetensors [...]

For each (DRAFTER_DIR, OUT) pair: SGLang resolves its launch arguments (DSPARK, compact verify mode, the
drafter as `speculative_draft_model_path`), publishes them as its scheduler does, builds the architecture
the checkpoint names (`Qwen3DSparkModel`, srt/models/dspark.py: DFlash backbone, Markov head, confidence
head) and runs its `load_weights` on the checkpoint's tensors; OUT then holds every parameter of SGLang's
model under SGLang's names (qkv_proj, gate_up_proj stacked), NaN wherever the loader wrote nothing.

A separate process, because SGLang publishes process-wide state (runtime context, a one-rank gloo group
standing in for its NCCL tensor-parallel group). One thing is bent to run on CPU: SGLang picks its
rotary-embedding kernel at construction (CUDA, or vLLM's on other devices); its CPU branch is selected
instead. Rotary embeddings hold no weights, so nothing loaded depends on it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for sglang_cpu
from serving import free_port  # noqa: E402  (a port outside the kernel's ephemeral range: no race)
from sglang_cpu import install_torchvision_stand_in  # noqa: E402


def main(target: str, pairs: list[tuple[str, str]]) -> None:
    torch.set_num_threads(1)
    install_torchvision_stand_in()
    os.environ["SGLANG_RAGGED_VERIFY_MODE"] = "compact"  # SGLang builds the confidence head only then
    from safetensors.torch import load_file, save_file
    from sglang.srt.distributed import parallel_state
    from sglang.srt.layers.rotary_embedding import base as rotary
    from sglang.srt.models.registry import ModelRegistry
    from sglang.srt.runtime_context import SpawnRanks, publish
    from sglang.srt.server_args import ServerArgs
    from transformers import AutoConfig

    rotary._is_cpu = True  # see the module docstring
    initialised = False
    for drafter, out in pairs:
        server_args = ServerArgs(model_path=target, device="cuda", speculative_algorithm="DSPARK",
                                 speculative_draft_model_path=drafter)  # fmt: skip
        server_args.resolve_once()
        publish(server_args, role="scheduler", ranks=SpawnRanks(world_rank=0))
        if not initialised:
            port = free_port()
            parallel_state.init_distributed_environment(
                world_size=1, rank=0, local_rank=0, distributed_init_method=f"tcp://127.0.0.1:{port}",
                backend="gloo",
            )  # fmt: skip
            parallel_state.initialize_model_parallel(backend="gloo")
            initialised = True
        config = AutoConfig.from_pretrained(drafter)
        model_class, _ = ModelRegistry.resolve_model_cls(config.architectures)
        model = model_class(config)
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.fill_(float("nan"))
        model.load_weights(load_file(str(Path(drafter) / "model.safetensors")).items())
        held = {name: p.detach().clone().contiguous() for name, p in model.named_parameters()}
        save_file(held, out, metadata={"class": model_class.__name__, "gamma": str(model.gamma)})


if __name__ == "__main__":
    target_dir, *rest = sys.argv[1:]
    main(target_dir, list(zip(rest[::2], rest[1::2])))
