#!/usr/bin/env bash
# Reference data off the critical path on the H100 (issue 12, item 2): a problem's first candidate from
# compiled to verdict, before/after, next to KernelBench's own order; and the same through the engine.
#
# On the development machine: bash bench/gpu/make-kit.sh ../shared/kernelbench   (release binary, .gpu/)
# On the GPU machine, from the repository root with .gpu/ carried, one device call per line (each step
# stays under 10 minutes; results land in $OUT as each step ends):
#   bash bench/gpu/refprep.sh bench19-correct   # 1/19 (6.4 GB inputs), the float4 ReLU kernel
#   bash bench/gpu/refprep.sh bench19-raises    # 1/19, a candidate that raises in trial 1
#   bash bench/gpu/refprep.sh bench-small       # 1/12 and 1/40 (small inputs), reference-equivalent
#   bash bench/gpu/refprep.sh engine            # 1/19 through `krefine run`, prepare_ahead 2 and 0
# Expected: in every bench table `same verdicts` is yes; the `ahead / KB` column (first candidate after a
# head start) <= 1.0 and the `later candidate` column <= 2 s for the small problems; for the engine runs,
# tables.py's `compiled → executed s` of turn 1 is lower with prepare_ahead 2 than with 0, and the log of
# the first has `reference_prepared` events before that turn's `executed`.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/krefine-out}
PY=${PY:-/opt/torch/.venv/bin/python3}
K=./.gpu/krefine
mkdir -p "$OUT" runs
export PYTHONUNBUFFERED=1

problem() { # level id -> path of the problem's code, from the kit's problems.jsonl
  local f="$OUT/problem_$1_$2.py"
  jq -r --argjson l "$1" --argjson p "$2" 'select(.level == $l and .problem_id == $p) | .code' \
    .gpu/problems.jsonl > "$f"
  echo "$f"
}
refeq() { # level id -> a reference-equivalent candidate (Model renamed to ModelNew)
  local f="$OUT/refeq_$1_$2.py"
  sed -E 's/\bModel\b/ModelNew/g' "$(problem "$1" "$2")" > "$f"
  echo "$f"
}
bench() { # name problem candidates... (head start 45 s: a CUDA candidate's fast build alone is ~35 s)
  local name=$1 p=$2; shift 2
  echo "== $(date +%T) krefine bench reference $name" | tee -a "$OUT/refprep.txt"
  timeout 590 $K bench reference "$p" "$@" --python "$PY" --device 0 --head-start-s "${HEAD:-45}" \
    --repeat "${REPEAT:-1}" --work-dir /tmp/krefine-bench-reference > "$OUT/$name.md" 2> "$OUT/$name.err"
  echo "exit $?" >> "$OUT/refprep.txt"
  cat "$OUT/$name.md" >> "$OUT/refprep.txt"
  rm -rf /tmp/krefine-bench-reference
}

case "${1:-}" in
bench19-correct)
  bench bench19-correct "$(problem 1 19)" bench/gpu/candidates/l1_19_relu_float4.py
  ;;
bench19-raises)
  bench bench19-raises "$(problem 1 19)" bench/reference/candidates/relu_raises.py
  ;;
bench-small)
  HEAD=15 REPEAT=2 bench bench-small-12 "$(problem 1 12)" "$(refeq 1 12)"
  HEAD=15 REPEAT=2 bench bench-small-40 "$(problem 1 40)" "$(refeq 1 40)"
  ;;
engine)
  for ahead in 2 0; do
    name=refprep-l1-19-ahead$ahead
    echo "== $(date +%T) krefine run $name" | tee -a "$OUT/refprep.txt"
    timeout 280 $K run .gpu/fused-l1.toml --no-tui --out "runs/$name" --set 'dataset.problems="19"' \
      --set "run.name=\"$name\"" --set "resources.prepare_ahead=$ahead" > "runs/$name.txt" 2>&1
    echo "exit $?" >> "$OUT/refprep.txt"
    python3 bench/gpu/tables.py "runs/$name" >> "$OUT/refprep.txt"
    jq -c 'select(.event.type == "reference_prepared" or .event.type == "compiled" or .event.type == "executed")
      | [.ts_ms, .event.type, .event.turn, .event.held_ms, .event.outcome.built]' \
      "runs/$name/events.jsonl" >> "$OUT/refprep.txt"
  done
  tar czf "$OUT/refprep-runs.tgz" --exclude='*/scratch' runs/refprep-*
  ;;
*)
  echo "usage: $0 bench19-correct|bench19-raises|bench-small|engine" >&2
  exit 2
  ;;
esac
