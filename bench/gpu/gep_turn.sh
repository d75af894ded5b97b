#!/usr/bin/env bash
# A recorded G+E+P refinement turn (issue 26): `krefine run` with feedback G+E+P and eval.profiler = "both"
# on one level 1 problem, 2 turns, the model scripted (the scripted provider answers from a JSONL file:
# turn 1 and turn 2 are real, correct CUDA kernels). The prompt of turn 2, as the run directory recorded
# it, must carry turn 1's Nsight Compute section: KernelBench's metrics and a roofline line per kernel.
#
# On the GPU machine, from the repository root (.gpu/krefine or .gpu/krefine.xz, .gpu/problems.jsonl):
#   bash bench/gpu/gep_turn.sh
# On the CPU (CPU=1; the quickstart problem and its answers): the turn still completes and its prompt
# carries the one-line reason the counters cannot be read.
#   CPU=1 KREFINE=target/debug/krefine bash bench/gpu/gep_turn.sh
# $OUT gets gep-turn-2-prompt.txt (the last message of turn 2's prompt), gep-turn.txt (the report and a
# PASS/FAIL line) and gep-turn-run.tgz (the run directory). PROBLEM, TURN1, TURN2 and DATA pick others.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/krefine-out}
SYS_PY=${SYS_PY:-python3}
W=${WORK:-runs/gep-turn-src}
R=runs/gep-turn
mkdir -p "$OUT" runs
rm -rf "$W" "$R" && mkdir -p "$W"
S="$OUT/gep-turn.txt"
: > "$S"

if [ -n "${KREFINE:-}" ]; then K=$KREFINE
elif [ -x .gpu/krefine ]; then K=./.gpu/krefine
elif [ -f .gpu/krefine.xz ]; then xz -dc .gpu/krefine.xz > /tmp/krefine-gep && chmod +x /tmp/krefine-gep; K=/tmp/krefine-gep
else K=./target/release/krefine
fi

sets=()
if [ -n "${CPU:-}" ]; then
  # The quickstart's element-wise add: its turn-2 and turn-3 answers are correct kernels (CUDA, with a
  # C++ loop where no GPU is present).
  DATA=${DATA:-configs/quickstart/problems}
  PROBLEM=${PROBLEM:-1}
  "$SYS_PY" - "$W" <<'PY'
import json, re, sys
answers = [json.loads(l) for l in open("configs/quickstart/answers.jsonl")]
for turn, source in ((1, 2), (2, 3)):
    content = next(a["content"] for a in answers if a["problem"] == "1/1" and a["turn"] == source)
    code = re.search(r"```python\n(.*?)```", content, re.S).group(1)
    open(f"{sys.argv[1]}/turn{turn}.py", "w").write(code)
PY
  TURN1=${TURN1:-$W/turn1.py}
  TURN2=${TURN2:-$W/turn2.py}
  sets+=(--set resources.devices=cpu --set eval.timing_trials=5 --set eval.correct_trials=2)
  [ -n "${PY:-}" ] && sets+=(--set "resources.python=\"$PY\"")
else
  # Level 1 problem 1 (4096 x 4096 fp32 matmul): 32 x 32 shared-memory tiles, then the honest tiled
  # matmul of the strict-mode set.
  DATA=${DATA:-.gpu/problems.jsonl}
  PROBLEM=${PROBLEM:-1}
  TURN1=${TURN1:-bench/compile/cuda/l1_1_matmul_smem_tiles.py}
  TURN2=${TURN2:-bench/gpu/candidates/strict/level_1_problem_1_sample_0_kernel.py}
  export PATH=/usr/local/cuda/bin:$PATH # ncu
  [ -n "${PY:-}" ] && sets+=(--set "resources.python=\"$PY\"")
fi

"$SYS_PY" - "$W/answers.jsonl" "1/$PROBLEM" "$TURN1" "$TURN2" <<'PY'
import json, sys
out, problem, *files = sys.argv[1:]
with open(out, "w") as f:
    for turn, path in enumerate(files, 1):
        code = open(path).read()
        content = f"Turn {turn}: a CUDA kernel.\n\n```python\n{code}\n```\n"
        f.write(json.dumps({"problem": problem, "sample": 0, "turn": turn, "content": content}) + "\n")
PY
data=$DATA
case $data in /*) ;; *) data=$PWD/$data ;; esac
cat > "$W/gep-turn.toml" <<EOF
[run]
name = "gep-turn"
[dataset]
path = "$data"
level = 1
problems = "$PROBLEM"
[method]
kind = "refine"
turns = 2
feedback = "GEP"
[model]
provider = "scripted"
name = "scripted"
answers = "answers.jsonl"
[eval]
profiler = "both"
EOF

echo "== krefine run (G+E+P, profiler both, problem 1/$PROBLEM, 2 turns: $TURN1, $TURN2)" | tee -a "$S"
# shellcheck disable=SC2086 # GEP_SETS: extra --set arguments, split on spaces
$K run "$W/gep-turn.toml" --no-tui --out "$R" "${sets[@]}" ${GEP_SETS:-} >> "$S" 2> "$R.stderr"
echo "exit $?" | tee -a "$S"
tail -5 "$R.stderr" >> "$S"
tar czf "$OUT/gep-turn-run.tgz" --exclude='*/scratch' "$R" "$W" 2>/dev/null

prompt=$R/prompts/level_1_problem_${PROBLEM}_sample_0_turn_2_prompt.json
"$SYS_PY" - "$prompt" "$OUT/gep-turn-2-prompt.txt" "${CPU:+cpu}" >> "$S" 2>&1 <<'PY'
import json, sys
path, out, cpu = sys.argv[1], sys.argv[2], sys.argv[3] == "cpu"
try:
    messages = json.load(open(path))
except (OSError, ValueError) as e:
    print(f"FAIL: no turn-2 prompt at {path} ({e.__class__.__name__})")
    sys.exit()
text = messages[-1]["content"]
open(out, "w").write(text)
ncu = [l for l in text.splitlines() if l.startswith("Nsight Compute:")]
if cpu:
    # The counters cannot be read on a CPU: one line saying why, and the turn still ran.
    ok = len(ncu) == 1 and "counters unavailable (" in ncu[0]
    print(("PASS" if ok else "FAIL") + f" (cpu): turn 2's prompt has {ncu or 'no Nsight Compute line'}")
    sys.exit()
checks = {
    "Nsight Compute section": bool(ncu) and "counters unavailable" not in ncu[0],
    "KernelBench's metrics (sm__cycles_active.avg)": "sm__cycles_active.avg" in text,
    "top kernels": "Top kernels by time" in text,
    "roofline line (% of SOL)": "% of SOL" in text,
}
# eval.profiler = "both": the torch profiler's table too (said, not required: its headers vary by version).
torch_table = any(h in text for h in ("Self CUDA", "CUDA total", "Self Device", "Device total"))
missing = [k for k, v in checks.items() if not v]
lines = [l.strip() for l in text.splitlines() if "% of SOL" in l or l.startswith("Nsight Compute:")]
verdict = "PASS" if not missing else "FAIL: missing " + "; ".join(missing)
table = "torch table present" if torch_table else "no torch table"
print(f"{verdict} ({table}): " + " | ".join(lines[:3]))
PY
tail -1 "$S"
