#!/usr/bin/env bash
# GPU readiness check, unattended, for a single-GPU machine whose image has torch + transformers but
# neither vLLM nor Megatron nor Ray (and no network). Wheels it lacks travel in .whl/ (see
# tests/gpu/README.md); the check runs the GPU tests, then a small timing table. Under 8 minutes.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/plexrl-gpu}
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
# the suite's own config wants Django and plugins the image lacks: a minimal one for this folder
timeout 300 python3 -m pytest -q -c tests/gpu/pytest.ini --rootdir tests/gpu tests/gpu 2>&1 | tee "$OUT/pytest.txt"
status=${PIPESTATUS[0]}
timeout 180 python3 tests/gpu/timing.py 2>&1 | tee "$OUT/timing.txt"
exit "$status"
