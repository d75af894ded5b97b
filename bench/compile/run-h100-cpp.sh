#!/usr/bin/env bash
# The C++ compile benchmark on the H100 machine's CPUs (16 cores): the C++ corpus (bench/compile/cpp) built
# the plain load_inline way and krefine's fast way, first 8 builds at once, then 2 at once (one candidate's
# plain and fast builds side by side on an otherwise idle machine), machine code compared; then the cost
# of one call through each build's bindings (call-overhead.py), where a split build's glue differs.
# Usage (from the folder holding krefine, cpp/ and call-overhead.py):  ./run-h100-cpp.sh OUT_DIR
set -euo pipefail
cd "$(dirname "$0")"
OUT=${1:?usage: run-h100-cpp.sh OUT_DIR}
PY=${PYTHON:-/opt/torch/.venv/bin/python3}
export PATH="$(dirname "$PY"):$PATH"
WORK=/tmp/krefine-bench-cpp
{ "$PY" -c 'import torch; print("torch", torch.__version__)'; c++ --version | head -1; nproc; } > "$OUT/machine-cpp.txt" 2>&1
./krefine bench compile --python "$PY" --jobs 8 --compare-code --work-dir "$WORK" cpp > "$OUT/cpp-j8.md" 2> "$OUT/cpp-progress.txt"
./krefine bench compile --python "$PY" --jobs 2 --compare-code --work-dir "$WORK" cpp > "$OUT/cpp-j2.md" 2>> "$OUT/cpp-progress.txt"
# One thread each, best of 15 samples per process, median of 5 alternated processes per build; six
# measurements at once on the 16 cores.
cat > "$OUT/calls.txt" <<'CALLS'
l1_19_relu relu_forward (torch.randn(16),)
l1_19_relu relu_forward (torch.randn(16, 16384),)
l1_47_sum_reduce sum_reduce (torch.randn(4, 16), 1)
l1_47_sum_reduce sum_reduce (torch.randn(16, 256, 256), 1)
l1_1_matmul_tiled matmul_tiled (torch.randn(4, 4), torch.randn(4, 4))
l1_1_matmul_tiled matmul_tiled (torch.randn(256, 256), torch.randn(256, 256))
l1_23_softmax softmax_rows (torch.randn(4, 4),)
l1_23_softmax softmax_rows (torch.randn(16, 16384),)
l1_88_gelu_fast_math gelu_tanh (torch.randn(16),)
l1_88_gelu_fast_math gelu_tanh (torch.randn(16, 16384),)
l2_1_conv_relu_bias conv_relu_bias (torch.randn(1, 1, 4, 4), torch.randn(1, 1, 1, 1), torch.randn(1), torch.randn(1, 1, 1))
l2_1_conv_relu_bias conv_relu_bias (torch.randn(16, 3, 32, 32), torch.randn(16, 3, 3, 3), torch.randn(16), torch.randn(16, 1, 1))
CALLS
"$PY" call-overhead.py --batch "$WORK" "$OUT/calls.txt" 6 > "$OUT/call-overhead.jsonl" 2>> "$OUT/cpp-progress.txt"
