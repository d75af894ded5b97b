"""Timing, structured as KernelBench's `cuda_event` timer (src/kernelbench/timing.py), with two recorded
differences: both reference and candidate run under `torch.no_grad()` (env.grad_mode = "no_grad"), and
the 256 MiB L2-flush buffer is allocated once per worker and refilled instead of re-allocated per trial.
Statistics keep full precision (KernelBench rounds to 3 significant digits; Rust can do that itself).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

# KernelBench's flush buffer: torch.empty((32, 1024, 1024), dtype=torch.int64) = 256 MiB, fill_(42).
L2_FLUSH_SHAPE = (32, 1024, 1024)
L2_FLUSH_VALUE = 42


class L2Flusher:
    """Holds the flush buffer for one device; allocated on first use and kept for the worker's life."""

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}

    def flush(self, device: torch.device) -> None:
        key = str(device)
        buffer = self._buffers.get(key)
        if buffer is None:
            buffer = torch.empty(L2_FLUSH_SHAPE, dtype=torch.int64, device=device)
            self._buffers[key] = buffer
        buffer.fill_(L2_FLUSH_VALUE)


def timing_method(device: torch.device) -> str:
    return "cuda_event" if device.type == "cuda" else "cpu_perf_counter"


def time_cuda_events(
    fn: Callable[..., Any],
    args: Sequence[Any],
    device: torch.device,
    warmup: int,
    trials: int,
    discard_first: int,
    flusher: L2Flusher | None,
) -> list[float]:
    """Per-call times in ms: warm-ups each followed by a sync, empty_cache, then per timed call
    device sync -> new events -> L2 flush -> start.record -> fn -> end.record -> device sync."""
    with torch.no_grad(), torch.cuda.device(device):
        for _ in range(warmup):
            fn(*args)
            torch.cuda.synchronize(device=device)
        torch.cuda.empty_cache()
        times: list[float] = []
        for index in range(trials + discard_first):
            torch.cuda.synchronize(device=device)
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            if flusher is not None:
                flusher.flush(device)
            start.record()
            fn(*args)
            end.record()
            torch.cuda.synchronize(device=device)
            if index >= discard_first:
                times.append(float(start.elapsed_time(end)))
    return times


def time_cpu(
    fn: Callable[..., Any], args: Sequence[Any], warmup: int, trials: int, discard_first: int
) -> list[float]:
    """The same loop on CPU with time.perf_counter (no flush: there is no device cache to clear)."""
    with torch.no_grad():
        for _ in range(warmup):
            fn(*args)
        times: list[float] = []
        for index in range(trials + discard_first):
            started = time.perf_counter()
            fn(*args)
            elapsed_ms = (time.perf_counter() - started) * 1000.0
            if index >= discard_first:
                times.append(elapsed_ms)
    return times


def time_callable(
    fn: Callable[..., Any],
    args: Sequence[Any],
    device: torch.device,
    timing: dict[str, Any],
    flusher: L2Flusher,
) -> list[float]:
    if device.type == "cuda":
        return time_cuda_events(
            fn,
            args,
            device,
            timing["warmup"],
            timing["trials"],
            timing["discard_first"],
            flusher if timing["l2_flush"] else None,
        )
    return time_cpu(fn, args, timing["warmup"], timing["trials"], timing["discard_first"])


def runtime_stats(times: Sequence[float]) -> dict[str, Any]:
    """mean, median, population std, min, max (ms, unrounded) and the count."""
    if not times:
        raise ValueError("no timing samples")
    values = [float(t) for t in times]
    mean = math.fsum(values) / len(values)
    return {
        "mean": mean,
        "median": float(statistics.median(values)),
        "std": math.sqrt(math.fsum((v - mean) ** 2 for v in values) / len(values)),
        "min": min(values),
        "max": max(values),
        "num_trials": len(values),
    }


def kernelbench_rounded(stats: dict[str, Any]) -> dict[str, Any]:
    """KernelBench's persisted form: every float rounded to 3 significant digits (`%.3g`)."""
    return {k: (float(f"{v:.3g}") if isinstance(v, float) else v) for k, v in stats.items()}
