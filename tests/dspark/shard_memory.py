"""Measure what one tensor-parallel rank materialises while it loads its shard (run in a fresh process).

    python tests/dspark/shard_memory.py MODEL_DIR RANK WORLD [DTYPE]

Prints one JSON line with three measures of the load:
- bytes read from the safetensors files, split into tensors tensor parallelism shards and tensors
  every rank keeps whole, counted at the reader (a loader that read whole tensors and sliced them
  afterwards would be caught), beside the loaded model's parameter bytes;
- the growth of the memory the process owns (RssAnon), which is where the weights end up;
- the growth of its peak resident set (VmHWM: the process's own ru_maxrss). That one also counts
  the pages of the file that safetensors' memory map brings in while the file is open: clean page
  cache, dropped with the map, and mapped around every touched page by the kernel, so it falls less
  than the others do.
test_tp.py runs it; so can a person.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from dspark import checkpoint, tp
from dspark.config import DTYPES
from dspark.model import CausalLM

read = {"sharded": 0, "whole": 0}


def _kind(name: str) -> str:
    module = name.rpartition(".")[0].rpartition(".")[2]
    return "sharded" if module in tp.COLUMN_PARALLEL + tp.ROW_PARALLEL else "whole"


class _CountingSlice:
    def __init__(self, name: str, lazy) -> None:
        self.name, self.lazy = name, lazy

    def get_shape(self):
        return self.lazy.get_shape()

    def __getitem__(self, index) -> torch.Tensor:
        tensor = self.lazy[index]
        read[_kind(self.name)] += tensor.numel() * tensor.element_size()
        return tensor


class _CountingFile:
    """safetensors' safe_open, counting every byte a get_slice or get_tensor hands out."""

    def __init__(self, handle) -> None:
        self.handle = handle

    def __enter__(self):
        self.handle.__enter__()
        return self

    def __exit__(self, *exc):
        return self.handle.__exit__(*exc)

    def keys(self):
        return self.handle.keys()

    def get_slice(self, name: str) -> _CountingSlice:
        return _CountingSlice(name, self.handle.get_slice(name))

    def get_tensor(self, name: str) -> torch.Tensor:
        return _CountingSlice(name, self.handle.get_slice(name))[:]


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def measure(model_dir: str, rank: int, world: int, dtype: str = "bfloat16") -> dict:
    torch.set_num_threads(1)
    real_open = checkpoint.safe_open
    checkpoint.safe_open = lambda *args, **kwargs: _CountingFile(real_open(*args, **kwargs))
    ckpt = checkpoint.load_checkpoint(model_dir, load_tokenizer=False)
    # The first meta-device model pulls in torch's meta kernels (~70 MB, whatever the model's size):
    # build one before the baseline so the growth below is the weights' alone.
    CausalLM.on_meta(ckpt)
    # RssAnon: the memory the process owns (not file pages it maps). VmHWM: its peak resident set,
    # ru_maxrss without the parent's peak that Linux carries across fork and exec into ru_maxrss.
    anon_before, peak_before = _status_kib("RssAnon"), _status_kib("VmHWM")
    model = tp.load_shard(ckpt, tp.TPContext(rank, world), DTYPES[dtype])
    anon_after, peak_after = _status_kib("RssAnon"), _status_kib("VmHWM")
    return {
        "rank": rank,
        "world": world,
        "read_sharded_bytes": read["sharded"],
        "read_whole_bytes": read["whole"],
        "param_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
        "rss_anon_growth_bytes": (anon_after - anon_before) * 1024,
        "peak_rss_growth_bytes": (peak_after - peak_before) * 1024,
    }


if __name__ == "__main__":
    print(json.dumps(measure(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), *sys.argv[4:])))
