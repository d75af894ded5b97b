#!/usr/bin/env bash
# The sandbox on the H100 (issue 16): the hostile set of tests/worker_sandbox.rs evaluated on GPU 0,
# the sandbox's cost, and what `krefine doctor` reports.
#
# On the development machine (builds the release binary and the release test binary into .gpu/):
#   bash bench/gpu/sandbox.sh kit
# On the GPU machine, from the repository root (with .gpu/ copied along):
#   bash bench/gpu/sandbox.sh run          # results in $OUT/sandbox.txt
# Expected: doctor says "namespaces: available"; bench prints the per-worker-start overhead and the
# per-candidate enter_candidate time; the test prints "test result: ok. 1 passed" (every hostile
# candidate finds no secret, no writable run log or foreign build, no network and no process outside,
# and every candidate is judged correct on the GPU inside the sandbox).
set -uo pipefail
cd "$(dirname "$0")/../.."
case "${1:-}" in
kit)
  set -e
  mkdir -p .gpu
  cargo build --release
  cp target/release/krefine .gpu/krefine
  bin=$(cargo test --release --test worker_sandbox --no-run --message-format=json 2>/dev/null |
    jq -r 'select(.profile.test == true and .target.name == "worker_sandbox") | .executable' | tail -1)
  cp "$bin" .gpu/worker_sandbox
  ls -l .gpu/krefine .gpu/worker_sandbox
  ;;
run)
  OUT=${OUT:-/tmp/krefine-out}
  mkdir -p "$OUT"
  S="$OUT/sandbox.txt"
  PY=${PY:-/opt/torch/.venv/bin/python3}
  {
    echo "== $(date -u +%FT%TZ) $(uname -r); $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null)"
    for f in /proc/sys/kernel/apparmor_restrict_unprivileged_userns /proc/sys/user/max_user_namespaces; do
      [ -r "$f" ] && echo "$f = $(cat "$f")"
    done
    echo "== unshare -Urpn --fork true: $(unshare -Urpn --fork true 2>&1 && echo ok)"
    echo "== doctor"
    printf '[dataset]\npath = "%s"\n[resources]\npython = "%s"\n' "$PWD/.gpu/problems.jsonl" "$PY" > "$OUT/doctor.toml"
    ./.gpu/krefine doctor "$OUT/doctor.toml" 2>&1
    echo "== bench sandbox"
    ./.gpu/krefine bench sandbox --python "$PY" --runs 30 2>&1
    echo "== hostile set on GPU 0"
    KREFINE_REPO_ROOT=$PWD KREFINE_TEST_PYTHON=$PY KREFINE_TEST_DEVICE=gpu \
      timeout 150 ./.gpu/worker_sandbox --nocapture > "$OUT/sandbox-gpu.log" 2>&1
    echo "exit $?"; grep -av '^ *[0-9]*: \|^ *at ' "$OUT/sandbox-gpu.log" | tail -40
    echo "== hostile set on the CPU device (same machine)"
    KREFINE_REPO_ROOT=$PWD KREFINE_TEST_PYTHON=$PY \
      ./.gpu/worker_sandbox 2>&1 | tail -5
  } 2>&1 | tee "$S"
  ;;
*)
  echo "usage: $0 kit|run" >&2
  exit 2
  ;;
esac
