#!/usr/bin/env bash
# The compile benchmark on the H100 machine: the CUDA corpus (bench/compile/cuda and the GPU quickstart
# candidates) built the plain load_inline way and krefine's fast way, 8 builds at once on 16 cores, with
# the device code of both builds compared (cuobjdump -sass) and the host objects too (objdump -d).
# Usage (from the folder holding krefine, cuda/ and gpu/):  ./run-h100.sh OUT_DIR
set -euo pipefail
cd "$(dirname "$0")"
OUT=${1:?usage: run-h100.sh OUT_DIR}
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export PATH="$CUDA_HOME/bin:$PATH"
PY=${PYTHON:-/opt/torch/.venv/bin/python3}
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; "$PY" -c 'import torch; print("torch", torch.__version__)'; nvcc --version | tail -2; nproc; } > "$OUT/machine.txt" 2>&1
./krefine bench compile --python "$PY" --arch 9.0 --jobs "${JOBS:-8}" --compare-code \
  --work-dir /tmp/krefine-bench-compile cuda gpu > "$OUT/cuda.md" 2> "$OUT/progress.txt"
# About 5-6 minutes on the H100 (15 candidates, 8 builds at once); give the command 10 minutes.
