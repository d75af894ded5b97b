#!/usr/bin/env bash
# The ssh launcher on the H100 (issue 18): the quickstart run twice on GPU 0, once with local workers
# and once with `launcher = "ssh"` to 127.0.0.1 (an sshd of its own on port 2222 with a throwaway key),
# one after the other; the verdicts must be the same and the speedups within noise.
#
# On the development machine:
#   bash bench/gpu/ssh.sh kit              # builds the release binary into .gpu/krefine
# On the GPU machine, from the repository root (with .gpu/ copied along; needs /usr/sbin/sshd, which
# openssh-server provides):
#   bash bench/gpu/ssh.sh run              # results in $OUT/ssh.txt
# Expected: both runs exit 0; every (task, turn) has the same compile status and verdict; the
# speedups of correct turns agree within noise (ratios printed per turn, typically 0.9-1.1 on a
# quiet GPU); every ssh result says ran_on.launcher = "ssh" and a GPU UUID, env.sandbox = "none".
set -uo pipefail
cd "$(dirname "$0")/../.."
case "${1:-}" in
kit)
  set -e
  mkdir -p .gpu
  cargo build --release
  cp target/release/krefine .gpu/krefine
  ls -l .gpu/krefine
  ;;
run)
  OUT=${OUT:-/tmp/krefine-out}
  # The quickstart's kernels run for microseconds, where speedups vary between two local runs as much as
  # anywhere; CONFIG=.gpu/refeq-l1.toml (reference-equivalent candidates, millisecond kernels) compares
  # speedups that a rerun reproduces.
  CONFIG=${CONFIG:-configs/quickstart.toml}
  PY=${PY:-/opt/torch/.venv/bin/python3}
  mkdir -p "$OUT" runs
  S="$OUT/ssh.txt"
  export KREFINE_SLURM_DIR=$OUT/sshd
  {
    echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null)"
    eval "$(scripts/slurm-test-cluster ssh-up)" || { echo "no sshd: cannot run the check"; exit 1; }
    trap 'scripts/slurm-test-cluster ssh-down' EXIT
    common=(--no-tui --set "resources.python=\"$PY\"" --set resources.devices=0 --set output.dir=\"runs/ssh-check\")
    echo "== local"
    ./.gpu/krefine run "$CONFIG" --out runs/ssh-local "${common[@]}" 2>&1 | tail -25
    echo "exit ${PIPESTATUS[0]}"
    echo "== ssh to 127.0.0.1"
    ./.gpu/krefine run "$CONFIG" --out runs/ssh-remote "${common[@]}" \
      --set resources.launcher=\"ssh\" --set 'resources.ssh.hosts=["127.0.0.1:0"]' \
      --set "resources.ssh.port=$KREFINE_TEST_SSH_PORT" --set "resources.ssh.identity=\"$KREFINE_TEST_SSH_KEY\"" \
      --set "resources.ssh.options=[\"-o\", \"UserKnownHostsFile=$KREFINE_TEST_SSH_KNOWN_HOSTS\"]" 2>&1 | tail -25
    echo "exit ${PIPESTATUS[0]}"
    echo "== comparison"
    "$PY" - runs/ssh-local runs/ssh-remote <<'PYEOF'
import json, sys
def load(d):
    out = {}
    for line in open(f"{d}/events.jsonl"):
        r = json.loads(line); e = r["event"]
        if e["type"] in ("compiled", "executed"):
            o = e["outcome"]
            out[(r["task"], e["turn"], e["type"])] = (o.get("verdict") or o.get("status"), o.get("speedup"), o.get("env", {}).get("ran_on") or o.get("ran_on"))
    return out
a, b = load(sys.argv[1]), load(sys.argv[2])
same = a.keys() == b.keys() and all(a[k][0] == b[k][0] for k in a)
print("same verdicts:", same)
for k in sorted(a):
    va, vb = a[k], b.get(k, (None, None, None))
    ratio = f"{vb[1] / va[1]:.3f}" if va[1] and vb[1] else "-"
    print(k, va[0], vb[0], "speedup local", va[1], "ssh", vb[1], "ratio", ratio, "ssh ran_on", vb[2])
PYEOF
  } 2>&1 | tee "$S"
  ;;
*)
  echo "usage: $0 kit|run" >&2
  exit 2
  ;;
esac
