#!/usr/bin/env bash
# The H100 checks, run from the repository root on the GPU machine with the kit of make-kit.sh in .gpu/.
#   bash bench/gpu/run.sh STEP...     steps: env refeq fused-l2 fused-l1 big-l1 big-l1-19 hostile strict-hostile exploits gpu-checks parity oom-sweep
#                                     baseline int-l4 cvd triton compile-baseline
# Each step's results land in $OUT as soon as it ends: summary.txt (appended) and runs.tgz (every run
# directory so far, scratch folders left out). KREFINE names another binary (default .gpu/krefine);
# DRY=1 runs only the CPU parts of the steps that have them (triton, compile-baseline: static checks,
# `eval --check`, the commands they would run).
set -uo pipefail
OUT=${OUT:-/tmp/krefine-out}
mkdir -p "$OUT" runs
export PYTHONUNBUFFERED=1
K=${KREFINE:-./.gpu/krefine}
DATA=${DATA:-.gpu/problems.jsonl}
S="$OUT/summary.txt"
log() { echo "== $(date +%T) $*" | tee -a "$S"; }
ms_since() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }
save() { tar czf "$OUT/runs.tgz" --exclude='*/scratch' runs; }
run() { # name config [extra args]
  local name=$1 cfg=$2; shift 2
  log "krefine run $cfg -> runs/$name $*"
  local t0; t0=$(date +%s%N)
  $K run "$cfg" --no-tui --out "runs/$name" "$@" > "runs/$name.report.txt" 2> "runs/$name.stderr"
  echo "exit $? wall $(ms_since "$t0") ms" >> "runs/$name.report.txt"
  cat "runs/$name.report.txt" >> "$S"; tail -3 "runs/$name.stderr" >> "$S"
  save
}
plain_load_inline() { # candidate file: a fresh Python process, empty TORCH_EXTENSIONS_DIR, as KernelBench builds
  local d t0; d=$(mktemp -d); t0=$(date +%s%N)
  TORCH_EXTENSIONS_DIR=$d TORCH_CUDA_ARCH_LIST=9.0 python3 -c "import runpy; runpy.run_path('$1')" \
    > "runs/plain-$(basename "$1" .py).log" 2>&1
  echo "plain load_inline $(basename "$1"): exit $? $(ms_since "$t0") ms" >> "$S"
}
step_env() {
  { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
    nvcc --version | tail -1; nproc; df -h /dev/shm . | tail -2
    python3 -c '
import time, torch
torch.manual_seed(42); t = time.perf_counter(); x = torch.rand(4096, 393216)
print(f"CPU torch.rand of 1/19 input (4096 x 393216 fp32, {x.numel()*4/1e9:.1f} GB): {time.perf_counter()-t:.1f} s")'
  } >> "$S" 2>&1
}
step_refeq() {
  run refeq-l1 .gpu/refeq-l1.toml
  run refeq-l2 .gpu/refeq-l2.toml
}
step_fused_l2() { # cold compiles, with plain load_inline of the same sources alongside
  plain_load_inline bench/gpu/candidates/l2_1_conv_relu_bias.py &
  plain_load_inline bench/gpu/candidates/l2_12_gemm_scale_leaky.py &
  run fused-l2 .gpu/fused-l2.toml
  wait
  sed 's/name = "fused-l2"/name = "fused-l2-cached"/' .gpu/fused-l2.toml > .gpu/fused-l2-cached.toml
  run fused-l2-cached .gpu/fused-l2-cached.toml
}
step_fused_l1() { run fused-l1 .gpu/fused-l1.toml; }
step_big_l1_19() { # one 6 GB problem, two turns: the second finds its reference cached
  run big-l1-19 .gpu/fused-l1.toml --set 'dataset.problems="19"' --set 'run.name="big-l1-19"'
}
step_big_l1() { step_big_l1_19; run big-l1-19-25 .gpu/fused-l1.toml --set 'run.name="big-l1-19-25"'; }
step_hostile() { run hostile .gpu/hostile.toml; }
step_strict_hostile() { # issue 23: the second-generation hacks with real CUDA kernels (level 1 problem 1);
  # sample 8 tampers with the timing loop's state (frames, gc): strict's native loop leaves it nothing
  local d=bench/gpu/candidates/strict mode
  for mode in faithful strict; do
    log "krefine check --mode $mode $d"
    $K check --mode $mode "$d"/*.py >> "$S" 2>&1
  done
  # faithful; strict as configured (the static layer rejects the hacks before they are built); strict
  # with the static categories at `warn`, so the runtime defences meet every hack.
  for v in faithful strict strict-runtime; do
    local sets=(--set "eval.mode=${v%-runtime}")
    [ "$v" = strict-runtime ] && sets+=(--set eval.checks.introspection=warn --set eval.checks.thread_injection=warn \
      --set eval.checks.timing_patch=warn --set eval.checks.stream_injection=warn --set eval.checks.code_bypass=warn)
    log "krefine eval $d (${sets[*]}) -> runs/strict-hostile-$v"
    $K eval "$d" --dataset .gpu/problems.jsonl --level 1 --out "runs/strict-hostile-$v" "${sets[@]}" \
      > "runs/strict-hostile-$v.txt" 2>&1
    echo "exit $?" >> "runs/strict-hostile-$v.txt"; cat "runs/strict-hostile-$v.txt" >> "$S"
    $K report "runs/strict-hostile-$v" >> "$S" 2>&1
    save
  done
}
step_exploits() { # issue 35: the exploit corpus (GPU ports and the CPU ports) in both modes with the honest
  # control between each, strict mode's cost, and the worker's clock against KernelBench's per size
  log "bench/gpu/exploits.py ${EXPLOIT_ARGS:-}"
  timeout "${EXPLOIT_TIMEOUT:-480}" python3 bench/gpu/exploits.py --harness src/harness --out runs/exploits ${EXPLOIT_ARGS:-} \
    > runs/exploits.txt 2>&1
  echo "exit $?" >> "$S"; cp runs/exploits/exploits.md "$OUT/" 2>/dev/null; tail -40 runs/exploits.txt >> "$S"; save
}
step_gpu_checks() {
  log "tests/python/run_gpu_checks.py"
  timeout 300 python3 tests/python/run_gpu_checks.py --work /tmp/krefine-gc --arch-list 9.0 --out runs/gpu_checks.json > runs/gpu-checks.txt 2>&1
  tail -5 runs/gpu-checks.txt >> "$S"; save
}
step_baseline() { # krefine baseline (eager) on level 1 against KernelBench's H100 baseline, then eval of a
  # submission of the reference-equivalent kernels (correct, speedups near 1), and the compile baseline.
  local sel="1,2,7,8,9,10,12,13,14,15,16,17,18,40" t0
  log "krefine baseline level 1 ($sel), eager"
  t0=$(date +%s%N)
  $K baseline --dataset .gpu/problems.jsonl --levels 1 --problems "$sel" --out runs/baseline-l1.json \
    > runs/baseline-l1.txt 2>&1
  echo "exit $? wall $(ms_since "$t0") ms" >> "$S"
  python3 bench/gpu/baseline_table.py runs/baseline-l1.json .gpu/baseline_h100_modal.json >> "$S" 2>&1
  $K report runs/baseline-l1.json.runs/level1-eager --submission runs/refeq-l1-sub.json >> "$S" 2>&1
  $K eval runs/refeq-l1-sub.json --dataset .gpu/problems.jsonl --out runs/eval-refeq-l1 > runs/eval-refeq-l1.txt 2>&1
  echo "eval exit $?" >> "$S"; tail -12 runs/eval-refeq-l1.txt >> "$S"
  $K report runs/eval-refeq-l1 --plot "$OUT/eval-refeq-l1.png" >> "$S" 2>&1
  log "krefine baseline level 1 ($sel), torch.compile default"
  $K baseline --dataset .gpu/problems.jsonl --levels 1 --problems "$sel" --mode compile \
    --out runs/baseline-l1-compile.json > runs/baseline-l1-compile.txt 2>&1
  echo "exit $?" >> "$S"
  python3 bench/gpu/baseline_table.py runs/baseline-l1-compile.json \
    .gpu/baseline_h100_modal_compile.json >> "$S" 2>&1
  cp runs/baseline-l1*.json "$OUT/"; save
}
step_int_l4() { # issue 17: integer inputs kept (default) and cast (KernelBench), tiny level-4 models on the GPU
  run int-l1 .gpu/int-l1.toml
  run int-l1-cast .gpu/int-l1.toml --set eval.cast_integer_inputs=true --set 'run.name="int-l1-cast"'
  python3 tests/python/hf_cache.py .gpu/hub >> "$S" 2>&1
  run tiny-l4 .gpu/tiny-l4.toml
  $K report runs/tiny-l4 --format json > runs/tiny-l4.report.json 2>> "$S"
  grep -h '"verdict"' runs/int-l1*/events.jsonl runs/tiny-l4/events.jsonl \
    | python3 -c 'import json,sys
for l in sys.stdin:
    r = json.loads(l); o = r["event"].get("outcome") or {}
    if r["event"]["type"] == "executed":
        print(r["task"], o.get("verdict"), o.get("speedup"), o.get("env", {}).get("integer_inputs"))' >> "$S"
  save
}
step_cvd() { # CUDA_VISIBLE_DEVICES set by a user or a scheduler is respected (issue 11, point 6)
  local uuid; uuid=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | head -1)
  CUDA_VISIBLE_DEVICES=0 run cvd-index configs/quickstart.toml --set 'run.name="cvd-index"'
  CUDA_VISIBLE_DEVICES=$uuid run cvd-uuid configs/quickstart.toml --set 'run.name="cvd-uuid"'
  # Index 1 among one visible GPU does not exist: refused before anything starts (exit 2).
  CUDA_VISIBLE_DEVICES=0 run cvd-missing configs/quickstart.toml --set 'run.name="cvd-missing"' \
    --set resources.devices=1
  for r in cvd-index cvd-uuid; do
    grep -h '"type":"executed"' "runs/$r/events.jsonl" | python3 -c '
import json, sys
d = [json.loads(l)["event"]["outcome"] for l in sys.stdin]
print(sys.argv[1], len(d), "executed;", sorted({(o["device"], o["env"]["device_name"]) for o in d}))' "$r" >> "$S"
  done
  save
}
triton_eval() { # name generations dataset [sets...]: krefine eval with backend triton, its report
  local name=$1 gen=$2 data=$3; shift 3
  if [ -n "${DRY:-}" ]; then
    log "krefine eval $gen --check (backend triton)"
    $K eval "$gen" --dataset "$data" --level 1 --check --set prompt.backend=triton "$@" >> "$S" 2>&1
    echo "exit $?" >> "$S"; return
  fi
  log "krefine eval $gen (backend triton $*) -> runs/$name"
  $K eval "$gen" --dataset "$data" --level 1 --out "runs/$name" --set prompt.backend=triton "$@" \
    > "runs/$name.txt" 2>&1
  echo "exit $?" >> "runs/$name.txt"; cat "runs/$name.txt" >> "$S"
  $K report "runs/$name" >> "$S" 2>&1
  python3 bench/gpu/tables.py "runs/$name" >> "$S" 2>&1
}
step_triton() { # issue 26: Triton candidates end to end. KernelBench's Triton example problem (element-wise
  # add: our prompts/examples pair, as a one-problem dataset) and Triton kernels of our own for level 1
  # (1 matmul, 19 ReLU, 23 softmax, 40 LayerNorm, 88 tanh GELU) in bench/gpu/candidates/triton.
  # TRITON_MODES: the eval.mode values to run (default faithful; "faithful strict" for both).
  local ex=runs/triton-example-src mode
  rm -rf "$ex"; mkdir -p "$ex/problems" "$ex/gen"
  cp prompts/examples/add_ref.py "$ex/problems/1_ElementwiseAdd.py"
  cp prompts/examples/add_triton.py "$ex/gen/level_1_problem_1_sample_0_kernel.py"
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' >> "$S" 2>&1
  log "krefine check --backend triton --mode strict"
  $K check --backend triton --mode strict bench/gpu/candidates/triton/*.py "$ex/gen"/*.py >> "$S" 2>&1
  echo "check exit $?" >> "$S"
  for mode in ${TRITON_MODES:-faithful}; do
    triton_eval "triton-example-$mode" "$ex/gen" "$ex/problems" --set "eval.mode=$mode"
    triton_eval "triton-l1-$mode" bench/gpu/candidates/triton "$DATA" --set "eval.mode=$mode"
  done
  [ -z "${DRY:-}" ] && save
}
step_compile_baseline() { # issue 26: `krefine baseline --mode compile` against KernelBench's published H100
  # inductor baseline, problem by problem (ratio, median). CB_LEVELS / CB_PROBLEMS pick the problems.
  local levels=${CB_LEVELS:-1} sel=${CB_PROBLEMS:-1,2,7,8,9,10,12,13,14,15,16,17,18,40}
  local theirs=${CB_THEIRS:-.gpu/baseline_h100_modal_compile.json}
  log "compile baseline: levels $levels problems $sel against $theirs"
  python3 bench/gpu/compile_baseline.py --krefine "$K" --dataset "$DATA" --levels "$levels" \
    --problems "$sel" --out runs/baseline-compile.json --theirs "$theirs" \
    --json "$OUT/compile-baseline-table.json" ${DRY:+--dry-run} >> "$S" 2>&1
  echo "exit $?" >> "$S"
  [ -z "${DRY:-}" ] && { cp runs/baseline-compile.json "$OUT/" 2>/dev/null; save; }
}
step_parity() { # issues 23/24: faithful-mode parity, re-run. The same kernels (PARITY_RUNS, a runs folder: by
  # default bench/gpu/throughput_batch.py's samples 0, 1 and 3 of eight small level-1 problems) through
  # KernelBench's own evaluation (a checkout's src/ in .gpu/kb/src: built in parallel, then one fresh
  # process per kernel) and through `krefine eval` (faithful), then compared kernel by kernel.
  local runs=${PARITY_RUNS:-.gpu/parity-runs} kb=${PARITY_KB:-.gpu/kb/src}
  mkdir -p "$OUT/parity"
  log "parity: krefine eval $runs (faithful)"
  local t0; t0=$(date +%s%N)
  $K eval "$runs" --dataset "$DATA" --level 1 --out runs/parity-krefine --set resources.compile_workers=16 \
    > runs/parity-krefine.txt 2>&1
  echo "krefine eval exit $? wall $(ms_since "$t0") ms" >> "$S"
  tail -25 runs/parity-krefine.txt >> "$S"
  log "parity: KernelBench's evaluation of $runs"
  PATH=/usr/local/cuda/bin:$PATH python3 bench/gpu/parity.py kb --kb-src "$kb" --runs "$runs" \
    --dataset "$DATA" --out "$OUT/parity" >> "$S" 2>&1
  python3 bench/gpu/parity.py compare --kb "$OUT/parity/kb.jsonl" --krefine runs/parity-krefine \
    --out "$OUT/parity/table.md" >> "$S" 2>&1
  # The run's event log (its build folders would not fit what comes back).
  cp runs/parity-krefine/events.jsonl "$OUT/parity/krefine-events.jsonl"
}
step_oom_sweep() { # issue 24: every level-1 problem's reference-equivalent candidate (no build) through
  # `krefine eval` with resources.prepare_ahead at its default; counts any out-of-memory and says whose.
  # OOM_SETS: extra --set arguments (default: device-drawn inputs, so the sweep fits one call);
  # OOM_PROBLEMS: a comma-separated subset of the problems (default all 100).
  local gen=runs/l1-refeq-all
  rm -rf "$gen"
  python3 bench/gpu/throughput_batch.py "$DATA" "$gen" --problems "${OOM_PROBLEMS:-$(seq -s, 1 100)}" --samples 0 >> "$S"
  log "oom sweep: krefine eval of $(ls "$gen" | wc -l) candidates ${OOM_SETS:---set eval.inputs=\"device\"}"
  local t0; t0=$(date +%s%N)
  # shellcheck disable=SC2086
  $K eval "$gen" --dataset "$DATA" --level 1 --out runs/oom-sweep ${OOM_SETS:---set eval.inputs=\"device\"} \
    > runs/oom-sweep.txt 2>&1
  echo "krefine eval exit $? wall $(ms_since "$t0") ms" >> "$S"
  tail -15 runs/oom-sweep.txt >> "$S"
  python3 - runs/oom-sweep/events.jsonl >> "$S" 2>&1 <<'PY'
import collections, json, sys
verdicts, oom = collections.Counter(), []
for line in open(sys.argv[1]):
    r = json.loads(line); e = r.get("event", {})
    if e.get("type") != "executed":
        continue
    o = e["outcome"]; verdicts[o["verdict"]] += 1
    text = (o.get("feedback", "") + json.dumps(o.get("metadata", {}))).lower()
    if "out of memory" in text or "outofmemory" in text:
        oom.append((r["task"], o["verdict"], o.get("feedback", "")[:160].replace("\n", " ")))
print("oom sweep verdicts:", dict(verdicts))
print(f"out of memory: {len(oom)}")
for t in oom:
    print("  ", *t)
# A problem's reference preparation on the device (issue 24: <= 5 s with device-drawn inputs): its steps
# prepared ahead (`reference_prepared`) and what its candidates' leases spent on reference work.
prep = collections.defaultdict(float)
for line in open(sys.argv[1]):
    r = json.loads(line); e = r.get("event", {})
    if e.get("type") == "reference_prepared":
        prep[e["problem"]] += e["outcome"].get("duration_ms", 0) / 1000
    elif e.get("type") == "executed":
        ph = e["outcome"].get("phases", {})
        prep[r["task"].rsplit("/", 1)[0]] += ph.get("reference_s", 0) + ph.get("ref_timing_s", 0)
slow = sorted(((s, p) for p, s in prep.items()), reverse=True)
median = sorted(prep.values())[len(prep) // 2] if prep else 0.0
print(f"reference preparation per problem: {len(prep)} problems, median {median:.2f} s, "
      f"over 5 s: {sum(s > 5 for s, _ in slow)}; slowest:", ", ".join(f"{p} {s:.1f} s" for s, p in slow[:8]))
PY
  gzip -c runs/oom-sweep/events.jsonl > "$OUT/oom-sweep-events.jsonl.gz"
}
for step in "$@"; do "step_${step//-/_}"; done
log done
