"""Issue 39 on one problem, through the harness directly (no krefine binary): the problem's reference data is
prepared on cuda:0 and its reference-equivalent candidate (the problem's code with `Model` renamed `ModelNew`)
is evaluated in each mode, while `nvidia-smi` samples the device's used memory (every process) every 0.1 s.
Run on the GPU machine from the repository root:

    python3 bench/gpu/problem_memory.py --dataset .gpu/problems.jsonl --problem 1/87 [--modes faithful,strict] [--device cpu]

Prints one JSON line per mode (verdict, the device's total and sampled peak use, the harness's
`metadata.device_memory`) and exits 1 unless every mode ends correct.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Self

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "python"))

from ballast import Ballast, NoBallast, ballast  # noqa: E402 - bench/gpu, the script's own folder

from harness_client import evaluate_request, prepare_request  # noqa: E402 - after the path set-up

# isort: split
# harness_client puts the harness on sys.path.
import kb_eval  # noqa: E402 - after the path set-up
import kb_prepare  # noqa: E402 - after the path set-up

MIB = 1 << 20


class Sampler:
    """The device's used memory (every process), sampled by nvidia-smi in a thread."""

    def __init__(self) -> None:
        self.peak_mib = 0
        self.total_mib = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                out = subprocess.run(
                    ["nvidia-smi", "--id=0", "--query-gpu=memory.used,memory.total", "--format=csv,noheader,nounits"],
                    capture_output=True,
                    text=True,
                    check=False,
                ).stdout
            except FileNotFoundError:  # no GPU here (--device cpu): nothing to sample
                return
            numbers = [int(n) for n in re.findall(r"\d+", out)]
            if len(numbers) >= 2:
                self.peak_mib = max(self.peak_mib, numbers[0])
                self.total_mib = numbers[1]
            time.sleep(0.1)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dataset", type=Path, required=True)
    parser.add_argument("--problem", default="1/87")
    parser.add_argument("--modes", default="faithful,strict")
    parser.add_argument("--device", default="cuda:0", help="cpu: a check of the script, not a measurement")
    parser.add_argument(
        "--leave-mib",
        type=int,
        default=0,
        help="emulate a smaller card: a ballast process holds all of device 0 but this many MiB (81559: an H100 80GB)",
    )
    args = parser.parse_args()
    level, pid = (int(x) for x in args.problem.split("/"))
    code = next(
        d["code"]
        for d in map(json.loads, args.dataset.read_text().splitlines())
        if d["level"] == level and d["problem_id"] == pid
    )
    candidate = re.sub(r"\bModel\b", "ModelNew", code)
    os.environ.setdefault("KREFINE_FRAME_TIMEOUT_S", "300")
    os.chdir(tempfile.mkdtemp())
    with ballast(args.leave_mib if args.device != "cpu" else 0) as held:
        return measure(args, code, candidate, held)


def measure(args: argparse.Namespace, code: str, candidate: str, held: Ballast | NoBallast) -> int:
    offset = held.describe().get("ballast_mib", 0)
    worker = kb_eval.Worker(isolate=True)
    ok = True
    with Sampler() as sampler:
        started = time.monotonic()
        prepared = kb_prepare.prepare(prepare_request(1, code, device=args.device), worker)
        print(json.dumps({"prepare": prepared["status"], "s": round(time.monotonic() - started, 1)}), flush=True)
        for i, mode in enumerate(args.modes.split(",")):
            sampler.peak_mib = 0
            started = time.monotonic()
            request = evaluate_request(10 + i, code, candidate, Path(tempfile.mkdtemp()), device=args.device, mode=mode)
            result: dict[str, Any] = kb_eval.evaluate(request, worker)
            time.sleep(0.3)
            line = {
                "problem": args.problem,
                "mode": mode,
                "status": result["status"],
                "s": round(time.monotonic() - started, 1),
                "device_total_mib": sampler.total_mib,
                "device_peak_used_mib": sampler.peak_mib - offset,
                **held.describe(),
                "runtime_ms": result.get("runtime_stats", {}).get("mean"),
                "device_memory": result.get("metadata", {}).get("device_memory"),
                "issue": {k: v for k, v in result.get("metadata", {}).items() if "issue" in k or "error" in k},
                "feedback": str(result.get("feedback", ""))[:400],
            }
            print(json.dumps(line), flush=True)
            ok &= result["status"] == "correct"
    worker.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
