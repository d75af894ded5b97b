#!/usr/bin/env bash
# The DSL backends on the GPU machine (issue 26): `cute` (the CuTe DSL), `tilelang` and `thunderkittens`,
# each evaluated by `krefine eval` (faithful mode) on KernelBench's element-wise add with the prompt's own
# worked example for the backend, and on level 1 candidates of our own (bench/gpu/candidates/<backend>/).
# The GPU machine has no network: the wheels and ThunderKittens' headers come in .gpu/dsl/ (git-ignored,
# never committed), split in parts of at most 50 MB (part1..part4) that successive calls carry.
#
# On a machine with PyPI access, the kit (wheels for Python 3.12 x86_64; ThunderKittens from a git checkout):
#   bash bench/gpu/dsl.sh kit PATH/TO/ThunderKittens   -> .gpu/dsl/part1..part4 and README.txt
# From the repository root on the GPU machine:
#   bash bench/gpu/dsl.sh stage       copy the parts present under .gpu/dsl/ into $KIT (once per part)
#   bash bench/gpu/dsl.sh run         stage what is present, install into $VENV, evaluate each backend
#   DRY=1 bash bench/gpu/dsl.sh run   anywhere, no GPU: the static checks and `eval --check` only
# $OUT/dsl-summary.txt gets one line per backend and problem: `ran: correct ...`, `ran: incorrect ...`,
# `failed to import ...`, `failed to build ...`; $OUT/dsl-runs.tgz the run directories and logs.
# BACKENDS picks backends (default: all three). A backend that fails does not stop the others.
# KREFINE names the binary (default .gpu/krefine, else .gpu/krefine.xz unpacked); DATA the level 1
# problems (default .gpu/problems.jsonl). SANDBOX_RETRY=1 (default) evaluates again with the sandbox
# off where a candidate was not correct, to tell the sandbox's part from the package's. EXAMPLES=0 or
# L1=0 leaves out the worked examples or the level 1 candidates (problem 19's inputs are 1.6 G elements,
# a minute of CPU each); EVAL_TIMEOUT bounds each `krefine eval` (default 420 s).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/krefine-out}
KIT=${KIT:-/tmp/dslkit}
VENV=${VENV:-/tmp/dslvenv}
DATA=${DATA:-.gpu/problems.jsonl}
BACKENDS=${BACKENDS:-cute tilelang thunderkittens}
SYS_PY=${SYS_PY:-python3}
mkdir -p "$OUT" runs
S="$OUT/dsl-summary.txt"
L="$OUT/dsl-log.txt"
log() { echo "== $(date +%T) $*" | tee -a "$L"; }
say() { echo "$*" | tee -a "$S" >> "$L"; }

stage() { # copy every part present into $KIT/wheels (the wheels) and $KIT (ThunderKittens)
  mkdir -p "$KIT/wheels"
  local p f
  for p in .gpu/dsl/part*/; do
    [ -d "$p" ] || continue
    for f in "$p"*; do cp -f "$f" "$KIT/wheels/"; done
    log "staged $p: $(ls "$p" | tr '\n' ' ')"
  done
  du -sb "$KIT/wheels" | tee -a "$L"
  local have=()
  [ -f "$KIT/wheels/cutlass_cu13.whl.part00" ] && have+=(part1)
  [ -f "$KIT/wheels/cutlass_cu13.whl.part01" ] && have+=(part2)
  ls "$KIT/wheels"/tilelang-*.whl > /dev/null 2>&1 && have+=(part3)
  ls "$KIT/wheels"/thunderkittens-*.tar.gz > /dev/null 2>&1 && have+=(part4)
  say "kit: staged ${have[*]:-nothing} (of part1..part4) in $KIT"
}

kit() { # ThunderKittens checkout -> .gpu/dsl/part1..4, each at most 50 MB
  local tk=${1:?usage: dsl.sh kit PATH/TO/ThunderKittens} d=.gpu/dsl dl=.gpu/dsl/dl
  local pip=("$SYS_PY" -m pip download --no-deps --only-binary=:all: --python-version 3.12 -d "$dl"
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_24_x86_64
    --platform manylinux_2_27_x86_64 --platform manylinux_2_28_x86_64)
  set -e
  rm -rf "$d" && mkdir -p "$dl" "$d"/part{1,2,3,4}
  # nvidia-cutlass-dsl 4.8.1 with its CUDA 13 libraries (its cu12 ones, a hard requirement of the meta
  # package, are left out: install it --no-deps); tilelang 0.1.15 (CUDA libraries dlopened through
  # stubs); the dependencies torch's Python does not have (numpy, typing_extensions, torch assumed);
  # pip itself, for a venv made without it.
  "${pip[@]}" nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-core==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1 \
    nvidia-cutlass-dsl-libs-cu13==4.8.1 "cuda-bindings==13.0.*" cuda-pathfinder protobuf \
    tilelang==0.1.15 "apache-tvm-ffi<0.1.13,>=0.1.11" torch-c-dlpack-ext cloudpickle ml-dtypes psutil tqdm \
    "z3-solver<4.15.5,>=4.13.0" pip
  local cu13
  cu13=$(cd "$dl" && ls nvidia_cutlass_dsl_libs_cu13-*.whl)
  (cd "$dl" && sha256sum "$cu13") > "$d/part4/cutlass_cu13.sha256"
  split -b 47900000 -d -a 2 "$dl/$cu13" "$d/cutlass_cu13.whl.part"
  mv "$d/cutlass_cu13.whl.part00" "$d/part1/"; mv "$d/cutlass_cu13.whl.part01" "$d/part2/"
  mv "$dl"/{cuda_pathfinder,ml_dtypes,protobuf,apache_tvm_ffi}-*.whl "$d/part2/"
  mv "$dl"/tilelang-*.whl "$d/part3/"
  rm "$dl/$cu13"; mv "$dl"/*.whl "$d/part4/"; rmdir "$dl"
  local rev
  rev=$(git -C "$tk" rev-parse --short=8 HEAD)
  git -C "$tk" archive --prefix=ThunderKittens/ HEAD include LICENSE | gzip -9 > "$d/part4/thunderkittens-$rev.tar.gz"
  { echo "DSL kit for bench/gpu/dsl.sh (made $(date -u +%F)). Sizes in bytes; each part is one device call's"
    echo "carry (at most 50 MB). Calls back to back, on one warm machine (its files go with it):"
    echo "  carry .gpu/dsl/part1: bash bench/gpu/dsl.sh stage   (likewise part2, part3)"
    echo "  carry .gpu/dsl/part4 .gpu/krefine.xz .gpu/problems.jsonl: bash bench/gpu/dsl.sh run"
    echo "The CUDA 13 CuTe DSL wheel ($cu13) is split in two (part1, part2), joined and checked by sha256."
    echo; du -sb "$d"/part* ; echo; du -b "$d"/part*/* ; } > "$d/README.txt"
  cat "$d/README.txt"
}

krefine_bin() {
  if [ -n "${KREFINE:-}" ]; then echo "$KREFINE"
  elif [ -x .gpu/krefine ]; then echo ./.gpu/krefine
  elif [ -f .gpu/krefine.xz ]; then xz -dc .gpu/krefine.xz > /tmp/krefine-dsl && chmod +x /tmp/krefine-dsl
    echo /tmp/krefine-dsl
  else echo ./target/release/krefine
  fi
}

install() { # the venv, with torch from the machine's Python; each backend's packages on their own
  local w=$KIT/wheels
  if [ -f "$w/cutlass_cu13.whl.part00" ] && [ -f "$w/cutlass_cu13.whl.part01" ]; then
    local whl
    whl=$(awk '{print $2}' "$w/cutlass_cu13.sha256")
    cat "$w/cutlass_cu13.whl.part00" "$w/cutlass_cu13.whl.part01" > "$w/$whl"
    (cd "$w" && sha256sum -c cutlass_cu13.sha256) >> "$L" 2>&1 || say "cute: the reassembled wheel's sha256 differs"
  fi
  if [ ! -x "$VENV/bin/python" ] && ! "$SYS_PY" -m venv --system-site-packages "$VENV" >> "$L" 2>&1; then
    rm -rf "$VENV" # no ensurepip in this Python: a venv without pip, which the kit's wheel provides
    "$SYS_PY" -m venv --without-pip --system-site-packages "$VENV" >> "$L" 2>&1
  fi
  # python3 here is itself a venv (/opt/torch/.venv): --system-site-packages reaches the interpreter's
  # base install, not that venv's packages. A .pth adds its site-packages after the new venv's own.
  if ! "$VENV/bin/python" -c 'import torch' 2>/dev/null; then
    local site
    site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    "$SYS_PY" -c 'import site; print("\n".join(site.getsitepackages()))' > "$site/machine-torch.pth"
  fi
  "$VENV/bin/python" -c 'import torch; print("venv torch", torch.__version__, torch.__file__)' >> "$L" 2>&1
  if ! "$VENV/bin/python" -m pip --version >> "$L" 2>&1; then
    local pipwhl
    pipwhl=$(ls "$w"/pip-*.whl | head -1)
    "$VENV/bin/python" "$pipwhl/pip" install --no-index "$pipwhl" >> "$L" 2>&1
  fi
  local pip=("$VENV/bin/python" -m pip install --no-index --find-links "$w" --disable-pip-version-check)
  log "pip: cute (nvidia-cutlass-dsl 4.8.1, CUDA 13 libraries; the cu12 ones are left out)"
  "${pip[@]}" nvidia-cutlass-dsl-libs-core nvidia-cutlass-dsl-libs-base nvidia-cutlass-dsl-libs-cu13 >> "$L" 2>&1 &&
    "${pip[@]}" --no-deps "$w"/nvidia_cutlass_dsl-4.8.1-py3-none-any.whl >> "$L" 2>&1 ||
    echo "cute: pip install failed (see dsl-log.txt)" >> "$L"
  log "pip: tilelang"
  "${pip[@]}" tilelang >> "$L" 2>&1 || echo "tilelang: pip install failed (see dsl-log.txt)" >> "$L"
  local tk
  tk=$(ls "$w"/thunderkittens-*.tar.gz 2>/dev/null | head -1)
  [ -n "$tk" ] && tar xzf "$tk" -C "$KIT"
  "$VENV/bin/python" -m pip list 2>/dev/null | grep -iE 'cutlass|tilelang|tvm|cuda-bindings|z3|torch ' >> "$L"
}

import_check() { # backend -> 0 when its package loads in the venv (the reason in the summary if not)
  local b=$1 py=$VENV/bin/python code msg
  case $b in
    cute) code='import cutlass, cutlass.cute as cute; print("cutlass-dsl", getattr(cutlass, "__version__", "?"))' ;;
    tilelang) code='import tilelang; print("tilelang", tilelang.__version__)' ;;
    thunderkittens)
      if [ ! -f "$THUNDERKITTENS_ROOT/include/kittens.cuh" ]; then
        say "thunderkittens: failed to import: no include/kittens.cuh under $THUNDERKITTENS_ROOT"; return 1
      fi
      code='import torch.utils.cpp_extension as c; print("nvcc from", c.CUDA_HOME)' ;;
  esac
  if ! msg=$("$py" -c "$code" 2>&1); then
    say "$b: failed to import: $(echo "$msg" | grep -v '^\s*$' | tail -1)"
    echo "$msg" >> "$L"; return 1
  fi
  echo "$b: $msg" | tee -a "$L"
}

summarize() { # backend label run-dir -> one line per problem from eval_results.json
  "$SYS_PY" - "$1" "$2" "$3" 2>&1 <<'PY'
import json, sys
b, label, run = sys.argv[1:4]
try:
    results = json.load(open(f"{run}/eval_results.json"))
except (OSError, ValueError):
    try:
        errors = [l.strip() for l in open(f"{run}.txt") if l.startswith("error")]
    except OSError:
        errors = []
    print(f"{b} {label}: failed: no eval_results.json; {errors[-1] if errors else f'see {run}.txt'}")
    sys.exit()
for pid, samples in sorted(results.items(), key=lambda kv: int(kv[0])):
    for r in samples:
        md = r.get("metadata", {})
        first = lambda v: str(v).strip().splitlines()[-1][:200] if v else ""
        if not r.get("compiled"):
            why = first(md.get("compilation_error")) or md.get("compilation_error_name", "")
            print(f"{b} {label} 1/{pid}: failed to build: {why}")
        elif r.get("correctness"):
            print(f"{b} {label} 1/{pid}: ran: correct, {r.get('runtime', -1):.4g} ms mean")
        elif md.get("runtime_error"):
            print(f"{b} {label} 1/{pid}: ran: runtime error: {first(md['runtime_error'])}")
        else:
            print(f"{b} {label} 1/{pid}: ran: incorrect: {first(md.get('correctness_issue', md))}")
PY
}

evaluate() { # backend label generations dataset [sets...]
  local b=$1 label=$2 gen=$3 data=$4; shift 4
  local sets=(--set "prompt.backend=$b" --set eval.mode=faithful "$@")
  if [ -n "${DRY:-}" ]; then
    log "krefine eval $gen --check (backend $b)"
    $K eval "$gen" --dataset "$data" --level 1 --check "${sets[@]}" >> "$L" 2>&1
    say "$b $label: eval --check exit $?"
    return
  fi
  local name=dsl-$b-$label lines
  sets+=(--set "resources.python=\"$VENV/bin/python\"")
  rm -rf "runs/$name"
  log "krefine eval $gen (backend $b) -> runs/$name"
  timeout "${EVAL_TIMEOUT:-420}" $K eval "$gen" --dataset "$data" --level 1 --out "runs/$name" "${sets[@]}" \
    > "runs/$name.txt" 2>&1
  echo "exit $?" >> "runs/$name.txt"; tail -5 "runs/$name.txt" >> "$L"
  $K report "runs/$name" >> "$L" 2>&1
  lines=$(summarize "$b" "$label" "runs/$name")
  say "$lines"
  # Not all correct: once more without the sandbox, to tell its part from the package's.
  if [ "${SANDBOX_RETRY:-1}" = 1 ] && [[ $label != *-nosandbox ]] && grep -qv "ran: correct" <<< "$lines"; then
    evaluate "$b" "$label-nosandbox" "$gen" "$data" "$@" --set eval.sandbox=off
  fi
}

backend() { # backend: its import check, then KernelBench's add example and our level 1 candidates
  local b=$1
  if [ -z "${DRY:-}" ]; then import_check "$b" || return; fi
  local ex=runs/dsl-$b-example-src
  rm -rf "$ex"; mkdir -p "$ex/problems" "$ex/gen"
  cp prompts/examples/add_ref.py "$ex/problems/1_ElementwiseAdd.py"
  cp "prompts/examples/add_$b.py" "$ex/gen/level_1_problem_1_sample_0_kernel.py"
  log "krefine check --backend $b"
  $K check --backend "$b" --mode faithful "$ex/gen"/*.py "bench/gpu/candidates/$b"/*.py >> "$L" 2>&1
  say "$b: krefine check exit $?"
  [ "${EXAMPLES:-1}" = 1 ] && evaluate "$b" example "$ex/gen" "$ex/problems"
  [ "${L1:-1}" = 1 ] && evaluate "$b" l1 "bench/gpu/candidates/$b" "$DATA"
}

K=$(krefine_bin)
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export THUNDERKITTENS_ROOT=${THUNDERKITTENS_ROOT:-$KIT/ThunderKittens}
case "${1:-run}" in
  kit) kit "${2:-}" ;;
  stage) stage ;;
  run)
    log "dsl backends: $BACKENDS (krefine $K, DRY=${DRY:-})"
    if [ -z "${DRY:-}" ]; then
      stage
      { nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; "$CUDA_HOME/bin/nvcc" --version | tail -1
        "$SYS_PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'; } >> "$L" 2>&1
      install
    fi
    for b in $BACKENDS; do backend "$b"; done
    [ -z "${DRY:-}" ] && tar czf "$OUT/dsl-runs.tgz" --exclude='*/scratch' runs/dsl-* 2>/dev/null
    log done
    ;;
  *) echo "usage: bash bench/gpu/dsl.sh [stage|run]" >&2; exit 2 ;;
esac
