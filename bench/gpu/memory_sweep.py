"""Issue 39's sweep: the reference-equivalent candidate of every level-1, -2 and -3 problem through `krefine
eval`, in faithful and strict mode, with per problem its verdict, the peak device memory of the worker and
of the candidate's process, and the wall time. Run on the GPU machine from the repository root:

    python3 bench/gpu/memory_sweep.py run --krefine .gpu/krefine --dataset .gpu/problems.jsonl \\
        --out "$OUT/memsweep" [--levels 1,2,3] [--modes faithful,strict] [--problems 1/87,1/19 | --heaviest N]
        [--inputs kernelbench|device] [--limit-s 540] [--device cpu] [--set KEY=VALUE]...
    python3 bench/gpu/memory_sweep.py table "$OUT/memsweep"      # the markdown table and the counts
    python3 bench/gpu/memory_sweep.py plan --dataset .gpu/problems.jsonl [--levels 1]   # sizes, heaviest first

`run` writes the candidates (the problem's code with `Model` renamed `ModelNew`: no build) as a KernelBench
runs folder, one folder per level, and evaluates each level once per mode (`--set eval.mode=...`), with
KernelBench's inputs (made on the CPU into the input store, `eval.inputs = "kernelbench"`, the default)
unless `--inputs device`. While `krefine eval` runs, `nvidia-smi --query-compute-apps` is sampled every
0.2 s: the worker is the process on the device for the longest time, and within a candidate's lease
(`lease_granted` to `lease_released` in the run's event log) the candidate's process is the largest of
the others (spares hold a CUDA context only). The harness's own figures come from each result's
`metadata.device_memory` (the worker's allocator peak, the problem's measured footprint, the candidate's
estimated working set, KernelBench's need). Results go to `<out>/results.jsonl`, one line per problem and
mode, appended (so chunks of problems run in separate device calls add up); `table` reads them.

An out of memory is counted in two ways: the verdict (`out_of_memory`, or `reference_error` marked
`reference_out_of_memory` / `problem_does_not_fit`), and any "out of memory" text in the feedback or the
findings (a warning such as a fresh-input probe that ran out). `krefine-caused` are those where the
harness's figures say KernelBench's own flow fits the device (`kernelbench_needs_bytes` at most
`available_bytes`): the ones issue 39 asks to be zero.

`--device cpu` runs the same pipeline on the CPU (no sampling): a check of the script, not a measurement.
`--heaviest N` takes the N problems of each level with the largest inputs and outputs (sized on the meta
device, nothing made), the ones where memory runs short.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Self

from ballast import Ballast, NoBallast, ballast

GIB = 1 << 30


# ------------------------------------------------------------------------------------------- problems


def load_problems(dataset: Path, levels: list[int]) -> list[dict[str, Any]]:
    out = []
    with dataset.open() as f:
        for line in f:
            if line.strip():
                d = json.loads(line)
                if d["level"] in levels:
                    out.append(d)
    return out


def meta_sizes(code: str) -> tuple[int | None, int | None]:
    """(input bytes, output bytes) of one get_inputs() and one forward, found on the meta device (nothing
    is made); None where the problem's code does not run there."""
    import torch

    namespace: dict[str, Any] = {}
    try:
        exec(compile(code, "<reference>", "exec"), namespace)  # noqa: S102 - KernelBench's problem code
        with torch.device("meta"):
            inputs = namespace["get_inputs"]()
            model = namespace["Model"](*namespace["get_init_inputs"]())
    except Exception:  # noqa: BLE001 - any failure means "unknown"
        return None, None
    tensors = [t for t in inputs if isinstance(t, torch.Tensor)]
    in_bytes = sum(t.numel() * t.element_size() for t in tensors)
    try:
        with torch.no_grad():
            out = model(*inputs)
        outs = out if isinstance(out, (list, tuple)) else [out]
        out_bytes = sum(t.numel() * t.element_size() for t in outs if isinstance(t, torch.Tensor))
    except Exception:  # noqa: BLE001
        return in_bytes, None
    return in_bytes, out_bytes


def heaviest(problems: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """The `n` problems of each level with the most bytes of inputs and output (meta device)."""
    by_level: dict[int, list[tuple[int, dict[str, Any]]]] = collections.defaultdict(list)
    for p in problems:
        i, o = meta_sizes(p["code"])
        by_level[p["level"]].append(((i or 0) + (o or 0), p))
    out = []
    for level in sorted(by_level):
        out += [p for _, p in sorted(by_level[level], key=lambda x: -x[0])[:n]]
    return out


def refeq(code: str) -> str:
    return re.sub(r"\bModel\b", "ModelNew", code)


# -------------------------------------------------------------------------------------------- sampler


class Sampler:
    """nvidia-smi's per-process device memory every `every` s, with a timestamp (ms): (ts, pid, MiB)."""

    def __init__(self, every: float = 0.2, ignore: int | None = None, offset_mib: int = 0) -> None:
        # `ignore`: a ballast process (bench/gpu/ballast.py), not sampled; `offset_mib`: what it holds,
        # taken off the device's used figure.
        self.every = every
        self.ignore = ignore
        self.offset_mib = offset_mib
        self.samples: list[tuple[int, int, int]] = []
        self.device: list[tuple[int, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self.available = shutil.which("nvidia-smi") is not None

    def __enter__(self) -> Self:
        if self.available:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self.available:
            self._thread.join()

    def _loop(self) -> None:
        while not self._stop.is_set():
            ts = int(time.time() * 1000)
            apps = _smi(["--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"])
            for line in apps:
                parts = [x.strip() for x in line.split(",")]
                if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit() and int(parts[0]) != self.ignore:
                    self.samples.append((ts, int(parts[0]), int(parts[1])))
            used = _smi(["--query-gpu=memory.used", "--format=csv,noheader,nounits"])
            if used and used[0].strip().isdigit():
                self.device.append((ts, int(used[0].strip()) - self.offset_mib))
            self._stop.wait(self.every)


def _smi(args: list[str]) -> list[str]:
    try:
        done = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return done.stdout.splitlines() if done.returncode == 0 else []


def worker_pid(samples: list[tuple[int, int, int]]) -> int | None:
    """The process seen on the device for the longest time: the evaluation worker."""
    seen: dict[int, list[int]] = {}
    for ts, pid, _ in samples:
        seen.setdefault(pid, []).append(ts)
    if not seen:
        return None
    return max(seen, key=lambda p: max(seen[p]) - min(seen[p]))


def window_peaks(sampler: Sampler, start: int, end: int, worker: int | None) -> dict[str, Any]:
    """Peak MiB in [start, end] of the worker, of the largest other process (the candidate's), and of the
    whole device."""
    inside = [(pid, mib) for ts, pid, mib in sampler.samples if start <= ts <= end]
    w = max((m for p, m in inside if p == worker), default=None)
    by_ts: dict[int, int] = {}
    for ts, pid, mib in sampler.samples:
        if start <= ts <= end and pid != worker:
            by_ts[ts] = max(by_ts.get(ts, 0), mib)
    cand = max(by_ts.values(), default=None)
    dev = max((m for ts, m in sampler.device if start <= ts <= end), default=None)
    return {"worker_mib": w, "candidate_mib": cand, "device_mib": dev}


# ---------------------------------------------------------------------------------------------- runs


def read_events(path: Path) -> list[dict[str, Any]]:
    out = []
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def per_problem(events: list[dict[str, Any]], sampler: Sampler | None) -> list[dict[str, Any]]:
    """One row per task that was executed: verdict, memory, wall."""
    worker = worker_pid(sampler.samples) if sampler is not None else None
    granted: dict[str, int] = {}
    windows: dict[str, tuple[int, int]] = {}
    rows: dict[str, dict[str, Any]] = {}
    for record in events:
        event, task = record.get("event", {}), record.get("task")
        kind = event.get("type")
        if kind == "lease_granted" and task:
            granted[task] = record["ts_ms"]
        elif kind == "lease_released" and task and task in granted:
            windows.setdefault(task, (granted[task], record["ts_ms"]))
        elif kind == "executed" and task:
            rows[task] = row_of(task, event["outcome"])
    for task, row in rows.items():
        if sampler is not None and task in windows:
            row.update(window_peaks(sampler, *windows[task], worker))
            row["lease_s"] = round((windows[task][1] - windows[task][0]) / 1000, 3)
    return list(rows.values())


def row_of(task: str, outcome: dict[str, Any]) -> dict[str, Any]:
    metadata = outcome.get("metadata") or {}
    memory = metadata.get("device_memory") or {}
    findings = outcome.get("findings") or []
    text = (outcome.get("feedback") or "") + json.dumps(findings) + json.dumps(metadata)
    level, pid = task.split("/")[:2]
    verdict = outcome.get("verdict")
    oom_verdict = verdict == "out_of_memory" or bool(
        metadata.get("reference_out_of_memory") or metadata.get("problem_does_not_fit")
    )
    fits = memory.get("kernelbench_needs_bytes") is not None and memory["kernelbench_needs_bytes"] <= memory.get(
        "available_bytes", 0
    )
    oom_text = bool(re.search(r"out of memory|outofmemory", text, re.IGNORECASE))
    return {
        "problem": f"{level}/{pid}",
        "verdict": verdict,
        "wall_s": round((outcome.get("wall_ms") or 0) / 1000, 3),
        "worker_peak_gib": _gib(memory.get("worker_peak_bytes")),
        "candidate_estimate_gib": _gib(memory.get("candidate_estimate_bytes")),
        "kernelbench_needs_gib": _gib(memory.get("kernelbench_needs_bytes")),
        "device_total_gib": _gib(memory.get("total_bytes")),
        "oom_verdict": oom_verdict,
        "oom_mentioned": oom_text,
        "does_not_fit": bool(metadata.get("problem_does_not_fit")),
        # An out of memory where KernelBench's own flow fits this device: krefine's to fix.
        # (krefine_out_of_memory: the reference ran out although krefine's figures say the problem fits.)
        "krefine_oom": (oom_verdict or oom_text)
        and (fits or not memory or bool(metadata.get("krefine_out_of_memory")))
        and not metadata.get("problem_does_not_fit"),
        "retried": bool(
            metadata.get("retried_without_device_cache") or "reference_retried_after_eviction" in metadata
        ),
        # What the result says, so that a failure is understood from the results alone.
        "error": str(metadata.get("runtime_error") or "")[:600],
        "feedback": (outcome.get("feedback") or "")[:1200],
    }


def _gib(n: Any) -> float | None:
    return round(n / GIB, 2) if isinstance(n, (int, float)) else None


def run(args: argparse.Namespace) -> int:
    levels = [int(x) for x in args.levels.split(",")]
    problems = load_problems(args.dataset, levels)
    if args.problems:
        wanted = set(args.problems.split(","))
        problems = [p for p in problems if f"{p['level']}/{p['problem_id']}" in wanted]
    elif args.heaviest:
        problems = heaviest(problems, args.heaviest)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    results = out / "results.jsonl"
    deadline = time.monotonic() + args.limit_s if args.limit_s else None
    with ballast(args.leave_mib) as held:
        for level in levels:
            run_level(args, problems, level, out, results, deadline, held)
    return 0


def run_level(
    args: argparse.Namespace,
    problems: list[dict[str, Any]],
    level: int,
    out: Path,
    results: Path,
    deadline: float | None,
    held: Ballast | NoBallast,
) -> None:
    mine = [p for p in problems if p["level"] == level]
    if not mine:
        return
    gen = out / "gen" / f"level{level}"
    shutil.rmtree(gen, ignore_errors=True)
    gen.mkdir(parents=True)
    for p in mine:
        (gen / f"level_{level}_problem_{p['problem_id']}_sample_0_kernel.py").write_text(refeq(p["code"]))
    for mode in args.modes.split(","):
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left < 30:
            print(f"level {level} {mode}: skipped (time limit)", flush=True)
            continue
        rows = run_one(args, gen, level, mode, len(mine), out, left, held)
        extra = {"mode": mode, "inputs": args.inputs, "label": args.label, **held.describe()}
        with results.open("a") as f:
            for row in rows:
                f.write(json.dumps({**row, **extra}) + "\n")
        bad = [r["problem"] for r in rows if r["krefine_oom"]]
        print(
            f"level {level} {mode}: {len(rows)} of {len(mine)} evaluated, krefine-caused out of memory: {bad}",
            flush=True,
        )


def run_one(
    args: argparse.Namespace,
    gen: Path,
    level: int,
    mode: str,
    count: int,
    out: Path,
    left: float | None,
    held: Ballast | NoBallast,
) -> list[dict[str, Any]]:
    run_dir = out / "runs" / f"level{level}-{mode}-{args.label}"
    shutil.rmtree(run_dir, ignore_errors=True)
    command = [str(args.krefine), "eval", str(gen), "--dataset", str(args.dataset), "--level", str(level)]
    command += ["--out", str(run_dir), "--set", f'eval.mode="{mode}"']
    if mode == "strict":
        # A reference-equivalent candidate has no custom kernel: strict mode's static check would reject
        # it before it runs (a warning here, so that its memory is measured).
        command += ["--set", 'eval.checks.missing_kernel="warn"']
    if args.inputs == "device":
        command += ["--set", 'eval.inputs="device"']
    if args.device == "cpu":
        command += ["--set", 'resources.devices="cpu"']
    for kv in args.set:
        command += ["--set", kv]
    started = time.monotonic()
    print(f"== level {level} {mode}: {count} problems: {' '.join(command)}", flush=True)
    offset = held.describe().get("ballast_mib", 0)
    sampler = Sampler(ignore=held.pid, offset_mib=offset) if args.device != "cpu" else None
    with sampler or _Nothing():
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=left, check=False)
            tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
        except subprocess.TimeoutExpired:
            tail = ["(stopped at the time limit)"]
    print(f"   exit after {time.monotonic() - started:.0f} s: " + " | ".join(tail), flush=True)
    return per_problem(read_events(run_dir / "events.jsonl"), sampler)


class _Nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


# --------------------------------------------------------------------------------------------- table


def table(args: argparse.Namespace) -> int:
    rows: list[dict[str, Any]] = []
    for path in args.dirs:
        results = path / "results.jsonl" if path.is_dir() else path
        rows += [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
    # The last row of each (problem, mode) wins: a chunk run again replaces the earlier one.
    last = {(r["problem"], r["mode"]): r for r in rows}
    rows = sorted(last.values(), key=lambda r: (tuple(int(x) for x in r["problem"].split("/")), r["mode"]))
    cols = [
        ("problem", "problem"),
        ("mode", "mode"),
        ("verdict", "verdict"),
        ("worker_mib", "worker MiB (smi)"),
        ("candidate_mib", "candidate MiB (smi)"),
        ("worker_peak_gib", "worker allocator GiB"),
        ("candidate_estimate_gib", "candidate est. GiB"),
        ("kernelbench_needs_gib", "KernelBench needs GiB"),
        ("wall_s", "wall s"),
    ]
    print("| " + " | ".join(title for _, title in cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        mark = " (krefine OOM)" if r.get("krefine_oom") else (" (does not fit)" if r.get("does_not_fit") else "")
        cells = [str(r.get(key)) if r.get(key) is not None else "" for key, _ in cols]
        cells[2] += mark
        print("| " + " | ".join(cells) + " |")
    for mode in sorted({r["mode"] for r in rows}):
        mine = [r for r in rows if r["mode"] == mode]
        verdicts = collections.Counter(r["verdict"] for r in mine)
        print(
            f"\n{mode}: {len(mine)} problems, verdicts {dict(verdicts)}; out of memory: "
            f"{sum(r['oom_verdict'] for r in mine)} verdicts, {sum(r['oom_mentioned'] for r in mine)} mentioned, "
            f"{sum(r['does_not_fit'] for r in mine)} do not fit, krefine-caused "
            f"{[r['problem'] for r in mine if r['krefine_oom']]}"
        )
    return 0


def plan(args: argparse.Namespace) -> int:
    levels = [int(x) for x in args.levels.split(",")]
    sized = []
    for p in load_problems(args.dataset, levels):
        i, o = meta_sizes(p["code"])
        sized.append(((i or 0) + (o or 0), p, i, o))
    for total, p, i, o in sorted(sized, key=lambda x: -x[0]):
        print(
            json.dumps(
                {
                    "problem": f"{p['level']}/{p['problem_id']}",
                    "inputs_gib": _gib(i),
                    "output_gib": _gib(o),
                    "total_gib": _gib(total),
                }
            )
        )
    return 0


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("--krefine", type=Path, required=True)
    r.add_argument("--dataset", type=Path, required=True)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--levels", default="1,2,3")
    r.add_argument("--modes", default="faithful,strict")
    r.add_argument("--problems", default="", help="a comma-separated list of LEVEL/ID (default: every one)")
    r.add_argument("--heaviest", type=int, default=0, help="only the N problems per level with the largest tensors")
    r.add_argument("--inputs", choices=["kernelbench", "device"], default="kernelbench")
    r.add_argument("--device", choices=["gpu", "cpu"], default="gpu")
    r.add_argument(
        "--limit-s",
        type=float,
        default=0.0,
        help="the whole sweep's time: no run starts after it, and a run still going then is stopped "
        "(its problems get no verdict); 0: no limit",
    )
    r.add_argument("--label", default="sweep", help="names the run folders (several chunks side by side)")
    r.add_argument("--set", action="append", default=[], help="passed on to krefine eval")
    r.add_argument(
        "--leave-mib",
        type=int,
        default=0,
        help="emulate a smaller card: a ballast process holds all of device 0 but this many MiB (81559: an H100 80GB)",
    )
    t = sub.add_parser("table")
    t.add_argument("dirs", type=Path, nargs="+")
    pl = sub.add_parser("plan")
    pl.add_argument("--dataset", type=Path, required=True)
    pl.add_argument("--levels", default="1,2,3")
    args = ap.parse_args(argv[1:])
    return {"run": run, "table": table, "plan": plan}[args.command](args)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
