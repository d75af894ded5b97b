#!/usr/bin/env bash
# The CUDA compile benchmark on a machine without a GPU or a CUDA toolkit: NVIDIA's nvcc wheels in the
# repository's .venv (scripts/setup-venv) compile CUDA candidates' objects as on a GPU host. The link of
# a CUDA extension wants libcudart, libc10_cuda and libtorch_cuda, which a CPU torch does not ship:
# empty stand-ins go on LIBRARY_PATH, so the build completes (its import then fails: only the build is
# measured). `--compare-code` needs cuobjdump and nvdisasm on PATH (NVIDIA's nvidia-cuda-cuobjdump and
# nvidia-cuda-nvdisasm wheels, or a toolkit); without them the comparison says `unavailable`.
#   bench/compile/cpu-cuda.sh OUT_DIR [KREFINE] [PATHS...]   (default paths: bench/compile/cuda)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:?usage: cpu-cuda.sh OUT_DIR [KREFINE] [PATHS...]}
KREFINE=${2:-${CARGO_TARGET_DIR:-target}/debug/krefine}
shift $(( $# > 1 ? 2 : 1 ))
PATHS=("$@")
[ ${#PATHS[@]} -gt 0 ] || PATHS=(bench/compile/cuda)
PY=$PWD/.venv/bin/python
CUDA_HOME=$("$PY" -c 'import nvidia, os; print(next(os.path.join(p, "cu13") for p in nvidia.__path__ if os.path.isdir(os.path.join(p, "cu13", "bin"))))')
export CUDA_HOME PATH="$CUDA_HOME/bin:$PATH" TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
stubs=$(mktemp -d)
trap 'rm -rf "$stubs"' EXIT
for lib in cudart c10_cuda torch_cuda; do
  echo "" | gcc -x c -shared -o "$stubs/lib$lib.so" -
done
export LIBRARY_PATH=$stubs${LIBRARY_PATH:+:$LIBRARY_PATH}
mkdir -p "$OUT"
"$KREFINE" bench compile --python "$PY" --arch "$TORCH_CUDA_ARCH_LIST" --jobs "${JOBS:-2}" --compare-code \
  --work-dir "${WORK:-/tmp/krefine-bench-cpu-cuda}" "${PATHS[@]}" > "$OUT/cuda.md" 2> "$OUT/progress.txt"
cat "$OUT/cuda.md"
