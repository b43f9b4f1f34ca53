#!/usr/bin/env bash
# The one install procedure: `make install` (and so CI) and both container images run this script,
# so the image build is exercised by every test run.
#
#   scripts/install.sh VENV [EXTRAS]
#
# VENV     the virtual environment to create (or reuse) and install into
# EXTRAS   optional extras of the dspark-serve package, comma-separated, e.g. "dev" (tests, lint) or ""
#          (serving only); "sglang" adds SGLang's engine with its CUDA stack (GPU hosts, Python 3.11+)
#
# Environment: PYTHON (the interpreter that creates VENV, default python3); PIP_EXTRA_INDEX_URL and the
# other PIP_* variables reach pip unchanged (the CUDA image points one at the CUDA build of torch).
set -euo pipefail

venv=${1:?usage: scripts/install.sh VENV [EXTRAS]}
extras=${2:-}
repo=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3}

[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
py="$venv/bin/python"
"$py" -m pip install -q --upgrade pip
SGLANG=sglang==0.5.23
py311=$("$py" -c 'import sys; print(int(sys.version_info >= (3, 11)))')
wanted=",$extras,"
pip_extras=$(echo "$wanted" | sed 's/,sglang,/,/g; s/^,*//; s/,*$//')
# The CPU tests of the SGLang backend: what its argument resolution and loaders import (sglang-cpu).
[[ $wanted == *,dev,* ]] && pip_extras="$pip_extras,sglang-cpu"
# Editable, so the repository's configs/ and deployments/ are what Ray workers import, here and in
# the image alike.
"$py" -m pip install -q -e "$repo${pip_extras:+[$pip_extras]}" -e "$repo/sdk"
if [[ $wanted == *,sglang,* ]]; then
    # SGLang with its own stack: it pins torch==2.14.1 (CUDA) over the torch pinned above, which pip
    # reports as a conflict with dspark-serve's pin; the SGLang backend runs on SGLang's torch.
    [[ $py311 == 1 ]] || { echo "install.sh: SGLang needs Python 3.11+ (no older wheels)" >&2; exit 1; }
    "$py" -m pip install -q "$SGLANG"
elif [[ $wanted == *,dev,* && $py311 == 1 ]]; then
    # SGLang's Python package alone (its dependencies are the CUDA stack): enough for the CPU tests.
    "$py" -m pip install -q --no-deps "$SGLANG"
fi
# The SDK's build generated the gRPC code from proto/ (never committed); importing it proves it is there.
"$py" -c "import dspark_client.proto"
