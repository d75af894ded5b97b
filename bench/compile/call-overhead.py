"""What a call into a built extension costs, plain build against split build (kb_split.py), side by side.

A split C++ build compiles pybind11's glue in a unit of its own, where GCC inlines some of it
differently from the plain build's single unit (the candidate's own functions are the same machine
code). This times the whole Python -> pybind11 -> candidate -> Python round trip of one bound function on
a tiny CPU tensor (where the glue is most of the time) or on a problem's real inputs (where the
candidate's code is), alternating the two builds in fresh processes, one thread.

Usage: python call-overhead.py WORK_DIR CANDIDATE FUNCTION ARGS [ROUNDS]
       python call-overhead.py --batch WORK_DIR FILE [PARALLEL]   (lines "CANDIDATE FUNCTION ARGS")
  WORK_DIR: a `krefine bench compile --work-dir` folder (builds/<candidate>-plain, builds/<candidate>-fast)
  ARGS: a Python expression for the arguments, with torch imported, e.g. "(torch.randn(16),)"
Prints one JSON line: median ns per call of each build and their ratio.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

TIMER = r"""
import importlib.util, sys, time, torch
path, function, args = sys.argv[1], sys.argv[2], eval(sys.argv[3])
name = path.rsplit("/", 1)[-1].split(".")[0]
spec = importlib.util.spec_from_file_location(name, path)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
f = getattr(module, function)
torch.set_num_threads(1)
# As many calls per sample as fill about 0.1 s (after 0.5 s of warm-up); the best of 15 samples.
n, start = 0, time.perf_counter()
while time.perf_counter() - start < 0.5:
    f(*args)
    n += 1
per_sample = max(1, n // 5)
best = float("inf")
for _ in range(15):
    start = time.perf_counter_ns()
    for _ in range(per_sample):
        f(*args)
    best = min(best, (time.perf_counter_ns() - start) / per_sample)
print(best)
"""

def one(so: Path, function: str, args: str) -> float:
    out = subprocess.run([sys.executable, "-c", TIMER, str(so), function, args], capture_output=True, text=True, check=True)
    return float(out.stdout.strip())


def measure(work: Path, candidate: str, function: str, args: str, rounds: int) -> dict[str, object]:
    builds = {mode: next((work / "builds" / f"{candidate}-{mode}").rglob("*.so")) for mode in ("plain", "fast")}
    times: dict[str, list[float]] = {"plain": [], "fast": []}
    for r in range(rounds):
        order = ("plain", "fast") if r % 2 == 0 else ("fast", "plain")
        for mode in order:
            times[mode].append(one(builds[mode], function, args))
    plain, fast = statistics.median(times["plain"]), statistics.median(times["fast"])
    split = any(p.name == "krefine_bind.o" for p in builds["fast"].parent.iterdir())
    return {"candidate": candidate, "args": args, "split": split, "plain_ns": round(plain, 1),
            "fast_ns": round(fast, 1), "ratio": round(fast / plain, 3), "rounds": rounds}


def main() -> int:
    if sys.argv[1] == "--batch":  # --batch WORK_DIR FILE [PARALLEL]: lines of "CANDIDATE FUNCTION ARGS"
        from concurrent.futures import ThreadPoolExecutor

        work, lines = Path(sys.argv[2]), [ln.split(" ", 2) for ln in Path(sys.argv[3]).read_text().splitlines() if ln.strip()]
        with ThreadPoolExecutor(int(sys.argv[4]) if len(sys.argv) > 4 else 6) as pool:
            for result in pool.map(lambda ln: measure(work, ln[0], ln[1], ln[2], 5), lines):
                print(json.dumps(result), flush=True)
        return 0
    work, candidate, function, args = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    rounds = int(sys.argv[5]) if len(sys.argv) > 5 else 5
    print(json.dumps(measure(work, candidate, function, args, rounds)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
