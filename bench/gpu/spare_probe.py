"""Which part of a spare candidate process's start slows a loop timed on the same GPU (issue 23)?

    python3 bench/gpu/spare_probe.py        (from the repository root, on the GPU machine)

Times the honest 4096 fp32 matmul in a loop (L2 flush and CUDA events, as the harness does) while a
second process, forked from the harness's forkserver, does one step of a start: its CPU warm-up, creating
a CUDA context, allocating the flush buffer, or holding an idle context; then whole starts
(`kb_process.CandidateProcess`). Prints, per case, the quiet loop and the loop while the step ran
(`slow`: calls slower than the quiet median + 0.3 ms), what the step took, and how long after
`Process.start()` the process's own code began. docs/benchmarks.md (fifth session) has the figures.
"""

from __future__ import annotations

import importlib
import os
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.join(os.getcwd(), "src/harness"))
import torch


def child(conn: Any, case: str, t0: float) -> None:
    entered = time.time() - t0
    dev = torch.device("cuda:0")
    if case in ("flush", "idle_ctx"):
        torch.cuda.set_device(dev)
        torch.empty(1, device=dev)
        torch.cuda.synchronize(dev)
    conn.send(("pre", entered))
    conn.recv()
    took: dict[str, float] = {}
    started = time.perf_counter()
    if case in ("ctx", "full"):
        torch.cuda.set_device(dev)
        torch.empty(1, device=dev)
        torch.cuda.synchronize(dev)
        took["ctx"] = time.perf_counter() - started
    if case in ("cpu", "full"):
        cpu = time.perf_counter()
        torch.ones(256, 256) @ torch.ones(256, 256)
        torch.ones(1 << 17).add_(1)
        importlib.import_module("torch.utils.cpp_extension")
        took["cpu"] = time.perf_counter() - cpu
    if case == "flush":
        buffer = torch.empty((32, 1024, 1024), dtype=torch.int64, device=dev)
        buffer.fill_(42)
        torch.cuda.synchronize(dev)
    if case == "idle_ctx":
        time.sleep(1.0)
    took["total"] = time.perf_counter() - started
    conn.send(took)
    conn.recv()


def loop(a: torch.Tensor, b: torch.Tensor, flush: torch.Tensor, until: Any = None, n: int | None = None) -> list[float]:
    """Per-call times (ms): n calls, or until `until` has a message (at least 20 calls)."""
    times: list[float] = []
    while True:
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        flush.fill_(42)
        start.record()
        torch.matmul(a, b)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
        if n is not None and len(times) >= n:
            return times
        if until is not None and until.poll(0) and len(times) >= 20:
            return times


def fmt(times: list[float], quiet_median: float) -> str:
    slow = sum(t > quiet_median + 0.3 for t in times)
    return (
        f"n {len(times):4} mean {statistics.fmean(times):.3f} med {statistics.median(times):.3f} "
        f"max {max(times):.3f} slow {slow}"
    )


def main() -> None:
    import kb_process

    context = kb_process.process_context("forkserver")
    dev = torch.device("cuda:0")
    a, b = torch.rand(4096, 4096, device=dev), torch.rand(4096, 4096, device=dev)
    flush = torch.empty((32, 1024, 1024), dtype=torch.int64, device=dev)
    loop(a, b, flush, n=50)
    for case in ["none", "cpu", "ctx", "flush", "idle_ctx", "full"] * 3:
        if case == "none":
            quiet = loop(a, b, flush, n=300)
            print(f"{case:10} {fmt(quiet, statistics.median(quiet))}", flush=True)
            continue
        parent, end = context.Pipe(duplex=True)
        process = context.Process(target=child, args=(end, case, time.time()))
        process.start()
        end.close()
        _, entered = parent.recv()
        quiet = loop(a, b, flush, n=100)
        parent.send("go")
        during = loop(a, b, flush, until=parent)
        took = parent.recv()
        parent.send("bye")
        process.join()
        median = statistics.median(quiet)
        steps = ", ".join(f"{k} {v:.2f}s" for k, v in took.items())
        print(
            f"{case:10} quiet: {fmt(quiet, median)} | during: {fmt(during, median)} | {steps} | "
            f"entered after {entered:.2f}s",
            flush=True,
        )
    for _ in range(3):
        quiet = loop(a, b, flush, n=100)
        median = statistics.median(quiet)
        started = time.perf_counter()
        spare = kb_process.CandidateProcess("cuda:0")
        during = loop(a, b, flush, until=spare.conn)
        spare.wait_ready()
        ready = time.perf_counter() - started
        spare.kill()
        print(
            f"{'spare':10} quiet: {fmt(quiet, median)} | during: {fmt(during, median)} | "
            f"ready after {ready:.2f}s, preloaded {spare.preloaded}",
            flush=True,
        )


if __name__ == "__main__":
    main()
