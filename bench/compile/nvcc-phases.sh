#!/usr/bin/env bash
# Where a CUDA object's build time goes, nvcc's way and kb_nvcc's overlapped way, on one object of a
# finished `krefine bench compile` (its fast build folder): the same nvcc command run twice, one after
# the other, (1) by nvcc itself with `--time` (each step's milliseconds), (2) through kb_nvcc.py with
# KREFINE_NVCC_TRACE=1 (when each step ended). Usage: nvcc-phases.sh FAST_BUILD_DIR OUT_FILE
set -euo pipefail
DIR=${1:?usage: nvcc-phases.sh FAST_BUILD_DIR OUT_FILE}
OUT=${2:?usage: nvcc-phases.sh FAST_BUILD_DIR OUT_FILE}
NINJA_DIR=$(dirname "$(find "$DIR" -name build.ninja | head -1)")
cd "$NINJA_DIR"
CMD=$(ninja -t commands cuda.cuda.o | tail -1)
case "$CMD" in *kb_nvcc.py*) ;; *) echo "not an overlapped build: $CMD" > "$OUT"; exit 0 ;; esac
OURS=${CMD//-o cuda.cuda.o/-o \/tmp\/phases-ours.o}
# The command is `PYTHON kb_nvcc.py REAL_NVCC ARGS`: nvcc's own is REAL_NVCC ARGS.
read -r -a WORDS <<< "$CMD"
THEIRS="${CMD#"${WORDS[0]} ${WORDS[1]} "}"
THEIRS=${THEIRS//-o cuda.cuda.o/-o \/tmp\/phases-nvcc.o --time \/tmp\/phases-nvcc.csv}
{
  echo "## $NINJA_DIR"
  echo "### nvcc --time"
  start=$(date +%s%N); eval "$THEIRS" > /dev/null 2>&1; end=$(date +%s%N)
  cat /tmp/phases-nvcc.csv; echo "wall $(( (end - start) / 1000000 )) ms"
  echo "### kb_nvcc (KREFINE_NVCC_TRACE=1)"
  start=$(date +%s%N); ( export KREFINE_NVCC_TRACE=1; eval "$OURS" ) 2>&1 | grep krefine-nvcc; end=$(date +%s%N)
  echo "wall $(( (end - start) / 1000000 )) ms"
} > "$OUT" 2>&1
