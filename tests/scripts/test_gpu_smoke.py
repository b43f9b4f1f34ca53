"""scripts/gpu_smoke.sh: the shell wrapper parses and refuses a machine without CUDA; its Python entry
runs here for real on the CPU in bf16 (every drafter, and 2-way tensor parallelism over gloo), so the
logic a GPU machine runs is exercised in CI. Only the device differs there."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_smoke.sh"


def test_shell_script_parses():
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True).returncode == 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="here it would run the whole GPU smoke check")
def test_shell_script_refuses_a_machine_without_cuda():
    env = {**os.environ, "PYTHON": sys.executable}
    proc = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 2, proc.stderr
    assert "has no CUDA device" in proc.stderr


@pytest.mark.slow  # about 25 s on two idle cores: builds the stack, spawns two TP ranks
def test_cpu_dry_run_of_the_smoke_check_passes(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "gpu_smoke.py"),
            *("--device", "cpu", "--dtypes", "bfloat16", "--tp", "on", "--work-dir", str(tmp_path)),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    for name in ("dspark", "dflash", "eagle3", "mtp1", "ngram", "tp=2 dspark"):
        assert any(re.match(rf"PASS  {re.escape(name)} cpu bfloat16 ", line) for line in lines), name
    assert "gpu_smoke: 6 passed, 0 failed on cpu (bfloat16)" in proc.stdout
