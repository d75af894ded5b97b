#!/usr/bin/env bash
# The 1/2/4-GPU curve of issue 36 (and 28): the same batch through `krefine bench throughput --cold-only`
# on 1, 2 and 4 devices of ONE machine (nvidia-h100-x4 or nvidia-h200-x4), fresh caches each time. One
# device count per call (each pass takes minutes), then `summary`:
#   bash bench/gpu/throughput_scaling.sh run 1      # devices [0]
#   bash bench/gpu/throughput_scaling.sh run 2      # devices [0,1]
#   bash bench/gpu/throughput_scaling.sh run 4      # devices [0,1,2,3]
#   bash bench/gpu/throughput_scaling.sh summary    # candidates per hour per host, and the ratios to 1 GPU
# Environment: KREFINE (the binary, default ./.gpu/krefine), SRC (runs folder, default .gpu/tb), DATASET
# (default .gpu/problems-tb.jsonl), LIMIT_S (default 560: a device call's 10 minutes, less the copy-back),
# EXTRA (more --set arguments, e.g. "--set eval.inputs=\"device\""). Compile workers and the CPU budget
# are left at their defaults (one worker per core, at most 64): the machine's cores are shared by all
# its GPUs, which is what the curve measures. The page cache is warmed first (warm_page_cache.sh;
# WARM_CACHE=0 skips it), so that no device count pays for a fresh machine's cold files. Outputs go to
# $OUT (default /tmp/krefine-out):
# scaling-N.txt (the table), scaling-N.tgz (the run, scratch left out).
set -uo pipefail
cmd=${1:?usage: throughput_scaling.sh run N | summary}
OUT=${OUT:-/tmp/krefine-out}
KREFINE=${KREFINE:-./.gpu/krefine}
SRC=${SRC:-.gpu/tb}
DATASET=${DATASET:-.gpu/problems-tb.jsonl}
LIMIT_S=${LIMIT_S:-560}
mkdir -p "$OUT"

devices_of() {
  local n=$1 list="0"
  for ((i = 1; i < n; i++)); do list="$list,$i"; done
  echo "[$list]"
}

case "$cmd" in
run)
  n=${2:?usage: throughput_scaling.sh run N}
  work=/tmp/krefine-scaling-$n
  rm -rf "$work"
  # The in-memory tier kept between runs is the machine's: inputs an earlier call left there would
  # make this "cold" pass warm for them (the table then says NOT COLD). KEEP_TIER=1 leaves it.
  [ -n "${KEEP_TIER:-}" ] || rm -rf /dev/shm/krefine-inputs.kept
  {
    nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
    echo "cores $(nproc), memory $(free -g | awk '/Mem:/ {print $2}') GiB"
    [ "${WARM_CACHE:-1}" = 0 ] || bash "$(dirname "$0")/warm_page_cache.sh"
  } > "$OUT/machine.txt" 2>&1
  # shellcheck disable=SC2086 # EXTRA is a list of arguments
  timeout --signal=INT --kill-after=30 "$LIMIT_S" "$KREFINE" bench throughput "$SRC" --dataset "$DATASET" \
    --cold-only --work-dir "$work" --set "resources.devices=$(devices_of "$n")" ${EXTRA:-} \
    > "$OUT/scaling-$n.txt" 2> "$OUT/scaling-$n.stderr"
  echo "== $n GPU(s): exit $?"
  cat "$OUT/scaling-$n.txt"
  tail -3 "$OUT/scaling-$n.stderr"
  tar czf "$OUT/scaling-$n.tgz" --exclude='*/scratch' --exclude='*/build-cache' --exclude='refs' \
    -C "$work" . 2>/dev/null
  ;;
summary)
  # candidates / wall for each device count (a host's rate), and its ratio to one GPU's.
  for n in 1 2 4; do
    f="$OUT/scaling-$n.txt"
    [ -f "$f" ] || continue
    cand=$(awk '/^candidates evaluated/ {print $3}' "$f")
    wall=$(awk '/^wall \(s\)/ {print $3}' "$f")
    echo "$n $cand $wall"
  done | awk '
    { per_hour = $2 * 3600 / $3; if (NR == 1) base = per_hour
      printf "%d GPU(s): %d candidates in %.1f s, %.0f per hour (host), %.2fx one GPU, %.0f per GPU-hour\n",
             $1, $2, $3, per_hour, per_hour / base, per_hour / $1 }'
  ;;
*)
  echo "usage: throughput_scaling.sh run N | summary" >&2
  exit 2
  ;;
esac
