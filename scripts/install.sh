#!/usr/bin/env bash
# The one install procedure: `make install` (and so CI) and both container images run this script,
# so the image build is exercised by every test run.
#
#   scripts/install.sh VENV [EXTRAS]
#
# VENV     the virtual environment to create (or reuse) and install into
# EXTRAS   optional extras of the dspark-serve package, e.g. "dev" (tests, lint) or "" (serving only)
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
# Editable, so the repository's configs/ and deployments/ are what Ray workers import, here and in
# the image alike.
"$py" -m pip install -q -e "$repo${extras:+[$extras]}" -e "$repo/sdk"
# The SDK's build generated the gRPC code from proto/ (never committed); importing it proves it is there.
"$py" -c "import dspark_client.proto"
