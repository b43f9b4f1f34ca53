#!/usr/bin/env bash
# On a machine with a CUDA GPU: the drafters' smoke check (scripts/gpu_smoke.sh), then the step costs of
# a Qwen3-4B- and a Qwen3-8B-shaped replica measured with the engine itself (bench/gpu_measure.py),
# each stage under its own time limit so a failure in one leaves the others' results.
#   scripts/gpu_profile.sh OUT_DIR
# Writes OUT_DIR/{nvidia-smi.txt,gpu_smoke.log,gpu_measure_<shape>.log,gpu_measurement_<shape>.json};
# `python bench/gpu_profile.py OUT_DIR/gpu_measurement_qwen3-4b.json` derives sim's profile from one.
set -uo pipefail

out=${1:?usage: scripts/gpu_profile.sh OUT_DIR}
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-$root/.venv/bin/python}"
[[ -x "$python" ]] || python="$(command -v python3)"
export PYTHONUNBUFFERED=1
mkdir -p "$out"
cd "$root"
# On a bare machine (the repository not pip-installed) the learned drafters' entry points
# (pyproject's dspark.drafters group) are unknown: publish them from a metadata folder of our own.
if ! "$python" -c 'import sys; from dspark.drafter import available_drafters as a; sys.exit("dspark" not in a())'; then
    meta=/tmp/dspark-meta
    "$python" - "$meta" <<'PY'
import pathlib, sys, tomllib
project = tomllib.loads(pathlib.Path("pyproject.toml").read_text())["project"]
info = pathlib.Path(sys.argv[1]) / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
info.mkdir(parents=True, exist_ok=True)
(info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
groups = project["entry-points"]
(info / "entry_points.txt").write_text(
    "".join(f"[{g}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) + "\n" for g, eps in groups.items())
)
PY
    export PYTHONPATH="$meta${PYTHONPATH:+:$PYTHONPATH}"
fi
"$python" -c 'from dspark.drafter import available_drafters as a; print("drafters:", a())'
nvidia-smi > "$out/nvidia-smi.txt" 2>&1
"$python" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'
PYTHON="$python" timeout "${SMOKE_S:-170}" scripts/gpu_smoke.sh --work-dir /tmp/dspark-smoke 2>&1 \
    | grep -v 'it/s]' | tee "$out/gpu_smoke.log"
for shape in qwen3-4b qwen3-8b; do
    timeout "${MEASURE_S:-170}" "$python" -m bench.gpu_measure --shape "$shape" --device cuda --dtype bfloat16 \
        --budget-s "${SWEEP_S:-110}" --work "/tmp/dspark-gpu-$shape" --out "$out/gpu_measurement_$shape.json" 2>&1 \
        | grep -v 'it/s]' | tee "$out/gpu_measure_$shape.log"
    rm -rf "/tmp/dspark-gpu-$shape"
done
