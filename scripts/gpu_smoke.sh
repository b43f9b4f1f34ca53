#!/usr/bin/env bash
# GPU smoke check: every drafter (dspark, dflash, eagle3, mtp1, ngram) with the engine on CUDA in fp16
# and bf16, greedy output judged by the near-tie rule of tests/greedy_match.py, and 2-way tensor
# parallelism over NCCL when two GPUs are visible. Builds the tests' tiny models (no hub, no network).
# Extra arguments go to scripts/gpu_smoke.py (--dtypes, --drafters, --tp on|off, --work-dir, --stack).
#   scripts/gpu_smoke.sh                 # after `make install` on a machine with CUDA
# Exit status: 0 all passed, 1 a check failed, 2 no CUDA device.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-$root/.venv/bin/python}"
[[ -x "$python" ]] || python="$(command -v python3)"

if ! "$python" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "gpu_smoke: $python has no CUDA device (torch $("$python" -c 'import torch; print(torch.__version__)'))" >&2
    exit 2
fi
"$python" -c 'import torch; n = torch.cuda.device_count(); print(f"gpu_smoke: {n} x {torch.cuda.get_device_name(0)}")'
export PYTHONUNBUFFERED=1
exec "$python" "$root/scripts/gpu_smoke.py" --device cuda --dtypes float16 bfloat16 "$@"
