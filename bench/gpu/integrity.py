"""Issue 10 on a GPU: the hostile set against a real `serve --role gpu` worker, and the per-candidate cost.

    python3 bench/gpu/integrity.py --harness DIR [--old-harness DIR] --out DIR [--n 4096]

Runs the harness in DIR (krefine's own worker: `serve --role gpu`, the same JSON-line protocol the Rust
pool speaks) on cuda:0 with a square fp32 matmul (KernelBench level 1 problem 1 at size n), and evaluates:
  A. KernelBench's three adversarial kernels (result reuse, zero-out, side stream), every order of the
     three as consecutive turns (a superpermutation), faithful then strict;
  B. the three-turn refinement timer patch -> honest -> memoise, and the honest kernel alone, both modes;
  C. each hack once per mode: memoisation, side stream, timer patch, background-thread fill, TF32 at
     import, bf16 downgrade, with the honest control in between;
  D. the per-candidate cost: the honest kernel evaluated several times in a row (phases, wall time);
  E. the same in strict mode (issue 23: fresh inputs per timed call and the worker's checks, timed in the
     native loop, kb_native; the cost must stay within 1.5x of the harness before it, --old-harness).
     D and E print the honest control's speedup per evaluation ("E-strict-cost speedups: ..."), how
     many fall within issue 23's x0.97-1.03, where strict mode timed the reference and the worker
     clock's figures.
With --old-harness, D, E and B also run against that harness (the code before this change) for comparison.
Candidates are pure PyTorch stand-ins that all call themselves `fast_matmul` (the name collision of the
issue is about the module a process keeps; building three real extensions would add minutes of nvcc).
Writes integrity.json (every response) and integrity.md (the tables) to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

PROBLEM = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super(Model, self).__init__()

    def forward(self, A, B):
        return torch.matmul(A, B)


N = {n}


def get_inputs():
    return [torch.rand(N, N), torch.rand(N, N)]


def get_init_inputs():
    return []
'''

STANDIN = '''
import sys, threading, time, types
import torch
import torch.nn as nn
{prelude}

def _load():
    if "fast_matmul" in sys.modules:  # a process keeps the first module of a name
        return sys.modules["fast_matmul"]
    module = types.ModuleType("fast_matmul")
    module.kind = {kind!r}
{body}
    module.forward = forward
    sys.modules["fast_matmul"] = module
    return module


fast_matmul = _load()


class ModelNew(nn.Module):
    def forward(self, A, B):
        return fast_matmul.forward(A, B)
'''

BODIES: dict[str, tuple[str, str]] = {
    "honest": ("", "    def forward(a, b):\n        return torch.matmul(a, b)\n"),
    "result_reuse": ("", "    def forward(a, b):\n        return torch.empty(a.shape[0], b.shape[1], device=a.device)\n"),
    "zero_out": ("", "    def forward(a, b):\n        a.zero_()\n        b.zero_()\n        return torch.matmul(a, b)\n"),
    "side_stream": (
        "",
        "    stream = torch.cuda.Stream()\n"
        "    def forward(a, b):\n"
        "        stream.wait_stream(torch.cuda.current_stream())\n"
        "        with torch.cuda.stream(stream):\n"
        "            return torch.matmul(a, b)\n",
    ),
    "memoise": (
        "",
        "    cache = {}\n"
        "    def forward(a, b):\n"
        "        key = (a.data_ptr(), b.data_ptr())\n"
        "        if key not in cache:\n"
        "            cache[key] = torch.matmul(a, b)\n"
        "        return cache[key]\n",
    ),
    "timer_patch": (
        "_e = torch.cuda.Event.elapsed_time\n"
        "torch.cuda.Event.elapsed_time = lambda self, end: _e(self, end) / 100.0\n"
        "_p = time.perf_counter\n_o = _p()\ntime.perf_counter = lambda: _o + (_p() - _o) / 100.0\n",
        "    def forward(a, b):\n        return torch.matmul(a, b)\n",
    ),
    "thread_fill": (
        "",
        "    def forward(a, b):\n"
        "        out = torch.empty(a.shape[0], b.shape[1], device=a.device)\n"
        "        def work():\n"
        "            torch.cuda.set_device(a.device)\n"
        "            torch.matmul(a, b, out=out)\n"
        "        threading.Thread(target=work, daemon=True).start()\n"
        "        return out\n",
    ),
    "tf32": (
        "torch.backends.cuda.matmul.allow_tf32 = True\ntorch.backends.cudnn.allow_tf32 = True\n",
        "    def forward(a, b):\n        return torch.matmul(a, b)\n",
    ),
    "bf16": ("", "    def forward(a, b):\n        return torch.matmul(a.bfloat16(), b.bfloat16()).float()\n"),
}


def source(kind: str) -> str:
    prelude, body = BODIES[kind]
    return STANDIN.format(prelude=prelude, kind=kind, body=body)


class Worker:
    def __init__(self, harness: Path, scratch: Path, log: Path) -> None:
        scratch.mkdir(parents=True, exist_ok=True)
        self.log = open(log, "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-u", str(harness / "krefine_harness.py"), "serve", "--role", "gpu", "--scratch", str(scratch)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, start_new_session=True,
        )
        self.ready = self.read()
        self.next_id = 1

    def read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise EOFError(f"worker exited ({self.proc.poll()})")
        return json.loads(line)

    def request(self, body: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.next_id += 1
        self.proc.stdin.write((json.dumps(dict(body, id=self.next_id)) + "\n").encode())
        self.proc.stdin.flush()
        response = self.read()
        while response.get("kind") == "progress":  # reference work announced during an evaluate
            response = self.read()
        return response

    def close(self) -> None:
        try:
            self.request({"op": "shutdown"})
        except Exception:  # noqa: BLE001
            pass
        self.proc.kill()


class Bench:
    def __init__(self, worker: Worker, problem: str, work: Path, peaks: dict[str, float | None]) -> None:
        self.worker, self.problem, self.work, self.peaks = worker, problem, work, peaks
        self.count = 0
        self.device = "cuda:0"
        self.rows: list[dict[str, Any]] = []

    def base(self, mode: str) -> dict[str, Any]:
        return {
            "problem": {"key": "level1/1_matmul", "code": self.problem, "code_hash": "x"},
            "device": self.device, "precision": "fp32", "mode": mode, "seed": 42, "correct_trials": 5,
            "timing": {"measure": True, "warmup": 3, "trials": 100, "discard_first": 1, "l2_flush": True},
            "reference_runtime": None,
        }

    def evaluate(self, kind: str, mode: str, group: str) -> dict[str, Any]:
        self.count += 1
        prepare = dict(self.base(mode), op="prepare")
        self.worker.request(prepare)
        # krefine's compile step creates a candidate's build dir; these stand-ins skip compiling, and the
        # confined candidate process may write inside its build dir but not create it.
        build_dir = self.work / f"c{self.count}"
        build_dir.mkdir(parents=True, exist_ok=True)
        request = dict(
            self.base(mode), op="evaluate",
            candidate={"source": source(kind), "build_dir": str(build_dir)},
            integrity={"max_speedup": None, **self.peaks},
        )
        started = time.perf_counter()
        r = self.worker.request(request)
        wall = time.perf_counter() - started
        row = {"group": group, "kind": kind, "mode": mode, "wall_s": wall, "response": r}
        self.rows.append(row)
        print(f"{group:10} {kind:13} {mode:8} {summary(r)}  wall {wall:.2f}s", flush=True)
        return r


def summary(r: dict[str, Any]) -> str:
    if not r.get("ok"):
        return f"ERROR {r.get('error')}"
    speed = f"x{r['speedup']:.2f}" if r.get("speedup") else "-"
    found = ",".join(f"{f['category']}:{f['severity'][0]}" for f in r.get("findings", [])) or "-"
    check = r.get("speedup_check") or {}
    flag = ""
    if check.get("flagged"):
        flag = f" flagged(>{check['bound']:.1f} {check['bound_source']}, verified={check.get('verified')})"
    issue = r["metadata"].get("integrity_issue_name") or r["metadata"].get("correctness_issue_name") or ""
    return f"{r['status']:10} {speed:8} {issue:22} findings={found}{flag}"


def run_new(args: argparse.Namespace, problem: str, out: Path) -> list[dict[str, Any]]:
    worker = Worker(args.harness, out / "scratch-new", out / "worker-new.log")
    bench = Bench(worker, problem, out / "build-new", {"peak_tflops": args.peak_tflops, "peak_bandwidth_gbs": args.peak_gbs})
    bench.device = args.device
    try:
        adversarial = ["result_reuse", "zero_out", "side_stream"]
        a, b, c = adversarial
        for mode in ("faithful", "strict") if "A" in args.groups else ():
            for kind in [a, b, c, a, b, a, c, b, a]:  # every order of the three as consecutive turns
                bench.evaluate(kind, mode, "A-adv")
        for mode in ("faithful", "strict") if "B" in args.groups else ():
            bench.evaluate("honest", mode, "B-alone")
            for kind in ("timer_patch", "honest", "memoise"):
                bench.evaluate(kind, mode, "B-3turn")
        for mode in ("faithful", "strict") if "C" in args.groups else ():
            for kind in ("memoise", "side_stream", "timer_patch", "thread_fill", "tf32", "bf16"):
                bench.evaluate(kind, mode, "C-hack")
                bench.evaluate("honest", mode, "C-control")
        for _ in range(args.repeat if "D" in args.groups else 0):
            bench.evaluate("honest", "faithful", "D-cost")
        for _ in range(args.repeat if "E" in args.groups else 0):
            bench.evaluate("honest", "strict", "E-strict-cost")
    finally:
        worker.close()
    return bench.rows


def run_old(args: argparse.Namespace, problem: str, out: Path) -> list[dict[str, Any]]:
    worker = Worker(args.old_harness, out / "scratch-old", out / "worker-old.log")
    bench = Bench(worker, problem, out / "build-old", {"peak_tflops": None, "peak_bandwidth_gbs": None})
    bench.device = args.device
    try:
        # D first: in the old harness the timer patch of B stays in the worker and would skew D.
        for _ in range(args.repeat if "D" in args.groups else 0):
            bench.evaluate("honest", "faithful", "D-cost-old")
        for _ in range(args.repeat if "E" in args.groups else 0):
            bench.evaluate("honest", "strict", "E-strict-cost-old")
        for mode in ("faithful", "strict") if "B" in args.groups else ():
            bench.evaluate("honest", mode, "B-alone-old")
            for kind in ("timer_patch", "honest", "memoise"):
                bench.evaluate(kind, mode, "B-3turn-old")
    finally:
        worker.close()
    return bench.rows


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| group | candidate | mode | verdict / speedup / issue / findings | wall s |", "|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['group']} | {row['kind']} | {row['mode']} | {summary(row['response'])} | {row['wall_s']:.2f} |")
    return "\n".join(lines)


def cost(rows: list[dict[str, Any]], group: str) -> str:
    picked = [r for r in rows if r["group"] == group and r["response"].get("ok")]
    if not picked:
        return f"{group}: none"
    keys = sorted({k for r in picked for k in r["response"]["phases"]})
    med = {k: statistics.median(r["response"]["phases"].get(k, 0.0) for r in picked) for k in keys}
    wall = statistics.median(r["wall_s"] for r in picked)
    return f"{group}: median wall {wall:.3f} s over {len(picked)}; phases " + ", ".join(f"{k} {v:.3f}" for k, v in med.items())


def speedups(rows: list[dict[str, Any]], group: str) -> str:
    """The honest control's speedup per evaluation of a group (issue 23's band: x0.97-1.03 in every one),
    with where strict mode timed the reference and the worker clock's figures (observed / reported mean
    ms per timed call, allowance)."""
    picked = [r["response"] for r in rows if r["group"] == group and r["response"].get("ok")]
    if not picked:
        return f"{group} speedups: none"
    values = [r["speedup"] for r in picked if r.get("speedup")]
    line = f"{group} speedups: " + ", ".join(f"x{v:.3f}" for v in values)
    if values:
        inside = sum(0.97 <= v <= 1.03 for v in values)
        line += f" (min x{min(values):.3f}, max x{max(values):.3f}; {inside} of {len(values)} within x0.97-1.03)"
    regimes = {(r["metadata"].get("strict_timing") or {}).get("reference_timed_in") for r in picked} - {None}
    if regimes:
        line += f"; strict reference timed in: {', '.join(sorted(regimes))}"
    clocks = [r["metadata"].get("worker_clock") for r in picked if r["metadata"].get("worker_clock")]
    if clocks:
        line += "; worker clock (observed/reported ms, allowance): " + ", ".join(
            f"{c['observed_mean_ms']:.3f}/{c['reported_mean_ms']:.3f} ({c.get('allowance_ms') or 0:.3f})" for c in clocks
        )
    return line


def native_timer(rows: list[dict[str, Any]]) -> str:
    """Whether the new harness's strict evaluations ran in the native timing loop. Strict mode times
    nowhere else: a strict evaluation the loop could not serve is refused with the finding
    `native_timer_unavailable`, so strict results that carry a time ran in it."""
    strict = [r["response"] for r in rows if r["mode"] == "strict" and r["response"].get("ok")]
    timed = sum(1 for r in strict if r.get("speedup") is not None)
    refused = sum(1 for r in strict if any(f["category"] == "native_timer_unavailable" for f in r.get("findings", [])))
    if not strict:
        return "native timer: no strict evaluation"
    return f"native timer: {timed} of {len(strict)} strict evaluations timed in it, {refused} refused as native_timer_unavailable"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--harness", type=Path, required=True)
    parser.add_argument("--old-harness", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--repeat", type=int, default=6)
    parser.add_argument("--device", default="cuda:0", help="cpu: a smoke test of this script")
    parser.add_argument("--groups", default="ABCDE", help="which of the groups A-E to run")
    # H100 SXM dense figures (src/prompt/gpu_specs.rs): fp32 non-tensor 67 TFLOP/s (the guard's fp32 peak in
    # both modes), 3350 GB/s. The Rust pool sends these from its GPU table.
    parser.add_argument("--peak-tflops", type=float, default=67.0)
    parser.add_argument("--peak-gbs", type=float, default=3350.0)
    args = parser.parse_args()
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    problem = PROBLEM.format(n=args.n)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    # Strict mode's native timing loop (kb_native), built by each worker on its first strict evaluation.
    os.environ.setdefault("KREFINE_NATIVE_DIR", str(out / "native-timer"))
    rows = run_new(args, problem, out)
    old = run_old(args, problem, out) if args.old_harness else []
    (out / "integrity.json").write_text(json.dumps(rows + old, indent=1))
    text = ["# integrity.py", "", table(rows), "", cost(rows, "D-cost"), cost(rows, "E-strict-cost"), native_timer(rows)]
    text += [speedups(rows, "D-cost"), speedups(rows, "E-strict-cost")]
    if old:
        text += ["", "## before (old harness)", "", table(old), "", cost(old, "D-cost-old"), cost(old, "E-strict-cost-old")]
        text += [speedups(old, "D-cost-old"), speedups(old, "E-strict-cost-old")]
    (out / "integrity.md").write_text("\n".join(text) + "\n")
    print("\n".join(line for line in text if "speedups" in line or "median wall" in line or "native timer" in line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
