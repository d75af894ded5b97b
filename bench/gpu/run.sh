#!/usr/bin/env bash
# The H100 checks, run from the repository root on the GPU machine with the kit of make-kit.sh in .gpu/.
# In priority order (each step's results land in $OUT as soon as it ends): golden seeds, quickstart on
# the GPU, reference-equivalent candidates (levels 1 and 2) with a plain load_inline compile timed
# alongside, hand-written fused kernels (cold compile), the same again (cached compile).
set -uo pipefail
OUT=${OUT:-/tmp/krefine-out}
mkdir -p "$OUT" runs
export PYTHONUNBUFFERED=1
K=./.gpu/krefine
S="$OUT/summary.txt"
log() { echo "== $(date +%T) $*" | tee -a "$S"; }
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
  nvcc --version | tail -1; } >> "$S" 2>&1
save() { tar czf "$OUT/runs.tgz" --exclude='*/scratch' runs; }
run() { # name config [extra args]
  local name=$1 cfg=$2; shift 2
  log "krefine run $cfg -> runs/$name"
  local t0=$(date +%s%N)
  $K run "$cfg" --no-tui --out "runs/$name" "$@" > "runs/$name.report.txt" 2> "runs/$name.stderr"
  echo "exit $? wall $(( ($(date +%s%N) - t0) / 1000000 )) ms" >> "runs/$name.report.txt"
  cat "runs/$name.report.txt" >> "$S"; tail -3 "runs/$name.stderr" >> "$S"
  save
}
log "golden trial seeds (seed 42, 5 trials)"
python3 src/harness/krefine_harness.py seeds >> "$S" 2>&1
run quickstart configs/quickstart.toml --set resources.compile_workers=16
log "plain load_inline of l2_1_conv_relu_bias (fresh TORCH_EXTENSIONS_DIR), in the background"
( d=$(mktemp -d); s=$(date +%s%N); TORCH_EXTENSIONS_DIR=$d TORCH_CUDA_ARCH_LIST=9.0 python3 -c "import runpy; runpy.run_path('bench/gpu/candidates/l2_1_conv_relu_bias.py')" > runs/plain.log 2>&1; echo "plain load_inline l2_1_conv_relu_bias: exit $? $(( ($(date +%s%N) - s) / 1000000 )) ms" >> "$S" ) &
run refeq-l1 .gpu/refeq-l1.toml
run refeq-l2 .gpu/refeq-l2.toml
wait
run fused-l2 .gpu/fused-l2.toml
run fused-l1 .gpu/fused-l1.toml
sed 's/name = "fused-l2"/name = "fused-l2-cached"/' .gpu/fused-l2.toml > .gpu/fused-l2-cached.toml
run fused-l2-cached .gpu/fused-l2-cached.toml
run hostile .gpu/hostile.toml
log done
