#!/usr/bin/env bash
# Issue 24's level-1 throughput batch on the GPU machine: `krefine eval` of 16 problems x 4 candidates
# (bench/gpu/throughput_batch.py), one label per binary or setting, each from a cold build cache.
#   bash bench/gpu/throughput.sh LABEL KREFINE_BIN LIMIT_S [--set KEY=VALUE]...
# Needs .gpu/tb/ (the runs folder) and .gpu/problems-tb.jsonl (the 16 problems), made here with
#   python3 bench/gpu/throughput_batch.py ../shared/kernelbench/problems.jsonl .gpu/tb
#   jq -c 'select(.level == 1 and ([.problem_id] | inside([8,14,15,17,43,49,54,60,64,66,70,71,77,80,86,93])))' \
#     ../shared/kernelbench/problems.jsonl > .gpu/problems-tb.jsonl
# Prints the wall time, how many candidates ended, and the report; the run directory goes to
# $OUT/LABEL.tgz (scratch left out).
set -uo pipefail
label=$1 bin=$2 limit=$3
shift 3
OUT=${OUT:-/tmp/krefine-out}
mkdir -p "$OUT" runs
out=runs/$label
rm -rf "$out" "runs/$label-cache"
t0=$(date +%s%N)
timeout --signal=INT --kill-after=30 "$limit" "$bin" eval .gpu/tb --dataset .gpu/problems-tb.jsonl \
  --out "$out" --set resources.compile_workers=16 --set "eval.build_cache=\"runs/$label-cache\"" "$@" \
  > "$out.report.txt" 2> "$out.stderr"
rc=$?
wall=$(( ($(date +%s%N) - t0) / 1000000 ))
executed=$(grep -c '"type":"executed"' "$out/events.jsonl" 2>/dev/null)
compiled=$(grep -c '"type":"compiled"' "$out/events.jsonl" 2>/dev/null)
{
  echo "== $label: exit $rc, wall $wall ms, compiled ${compiled:-0}, executed ${executed:-0}"
  cat "$out.report.txt"
  tail -5 "$out.stderr"
} | tee -a "$OUT/summary.txt"
tar czf "$OUT/$label.tgz" --exclude='*/scratch' "$out" "$out.report.txt" "$out.stderr" 2>/dev/null
