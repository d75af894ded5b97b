#!/usr/bin/env bash
# Two krefine builds side by side on ONE machine, in one device call: the page cache warmed first
# (warm_page_cache.sh), then a cold pass of each (`krefine bench throughput --cold-only`; with WARM=1, a
# cold and a warm pass), fresh caches and the in-memory tier emptied each time, in the order given.
# Machines of one kind differ by 20-30 % on this batch, so two trees are compared only this way
# (docs/benchmarks.md, tenth session).
#   A=./.gpu/krefine-base B=./.gpu/krefine bash bench/gpu/throughput_ab.sh
# Environment: A, B (the binaries), SRC (candidates, default .gpu/tb), DATASET (default
# .gpu/problems-tb.jsonl), LIMIT_S (per tree, default 270), EXTRA (more arguments, e.g. "--set ..."),
# WARM=1 (both passes, `--warm-builds`, instead of the cold pass alone: the eleventh session's half batch,
# SRC=.gpu/th, problems 8,15,43,54,64,70,77,86 of the batch: throughput.sh's jq line with that list),
# OUT (default /tmp/krefine-out): ab-a.txt, ab-b.txt (the tables), ab-a.tgz, ab-b.tgz (the runs, scratch
# and builds left out), machine.txt.
set -uo pipefail
OUT=${OUT:-/tmp/krefine-out}
SRC=${SRC:-.gpu/tb}
DATASET=${DATASET:-.gpu/problems-tb.jsonl}
LIMIT_S=${LIMIT_S:-270}
mkdir -p "$OUT"
{
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader
  echo "cores $(nproc), memory $(free -g | awk '/Mem:/ {print $2}') GiB"
  bash "$(dirname "$0")/warm_page_cache.sh"
} > "$OUT/machine.txt" 2>&1
for side in a b; do
  bin=${A:?set A and B to the two binaries}
  [ "$side" = b ] && bin=${B:?set B}
  work=/tmp/krefine-ab-$side
  rm -rf "$work" /dev/shm/krefine-inputs.kept
  passes=--cold-only
  [ "${WARM:-0}" = 1 ] && passes=--warm-builds
  # shellcheck disable=SC2086 # EXTRA is a list of arguments
  KREFINE_LEASE_TRACE=1 timeout --signal=INT --kill-after=30 "$LIMIT_S" "$bin" bench throughput "$SRC" \
    --dataset "$DATASET" "$passes" --work-dir "$work" ${EXTRA:-} > "$OUT/ab-$side.txt" 2> "$OUT/ab-$side.stderr"
  echo "== $side ($bin): exit $?"
  grep -E '^(wall \(s\)|candidates per GPU-hour|time to first result)' "$OUT/ab-$side.txt"
  tar czf "$OUT/ab-$side.tgz" --exclude='*/scratch' --exclude='*/build-cache' --exclude='refs' \
    -C "$work" . 2>/dev/null
  rm -f "$OUT/ab-$side.stderr"
done
