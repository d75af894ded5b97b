"""Timing, structured as KernelBench's `cuda_event` timer (src/kernelbench/timing.py), with two recorded
differences: both reference and candidate run under `torch.no_grad()` (env.grad_mode = "no_grad"), and
the 256 MiB L2-flush buffer is allocated once per process and refilled instead of re-allocated per trial.
Statistics keep full precision (KernelBench rounds to 3 significant digits; Rust can do that itself).

Every clock and event function is captured when this module is imported, which in a candidate process
is before the candidate's code is: a candidate that replaces `time.perf_counter` or
`torch.cuda.Event.elapsed_time` changes nothing here (and kb_candidate reports that it tried).

These timers are faithful mode's (KernelBench's loop, in the candidate's own process) and the worker's
for the reference. Strict mode does not use them: the worker times each call on its own clock from the
other side of the candidate process's channel (kb_drive).
"""

from __future__ import annotations

import importlib
import math
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

# Captured before any candidate code runs (see the module doc). Keep these module-private names only.
_perf_counter = time.perf_counter
_Event = torch.cuda.Event
_event_record = torch.cuda.Event.record
_event_elapsed = torch.cuda.Event.elapsed_time
_cuda_synchronize = torch.cuda.synchronize
_no_grad = torch.no_grad
_clone = torch.Tensor.clone
CAPTURED: dict[str, tuple[Any, str, Any]] = {
    # name -> (owner, attribute, the original): what a candidate must leave alone.
    "time.perf_counter": (time, "perf_counter", time.perf_counter),
    "time.perf_counter_ns": (time, "perf_counter_ns", time.perf_counter_ns),
    "time.time": (time, "time", time.time),
    "time.monotonic": (time, "monotonic", time.monotonic),
    "torch.cuda.Event": (torch.cuda, "Event", torch.cuda.Event),
    "torch.cuda.Event.record": (torch.cuda.Event, "record", torch.cuda.Event.record),
    "torch.cuda.Event.elapsed_time": (torch.cuda.Event, "elapsed_time", torch.cuda.Event.elapsed_time),
    "torch.cuda.Event.synchronize": (torch.cuda.Event, "synchronize", torch.cuda.Event.synchronize),
    "torch.cuda.synchronize": (torch.cuda, "synchronize", torch.cuda.synchronize),
    "torch.allclose": (torch, "allclose", torch.allclose),
    "torch.equal": (torch, "equal", torch.equal),
}


def patched_functions() -> list[str]:
    """The captured functions that are no longer what they were when this module was imported."""
    return [name for name, (owner, attr, original) in CAPTURED.items() if getattr(owner, attr, None) is not original]


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
    with _no_grad(), torch.cuda.device(device):
        for _ in range(warmup):
            fn(*args)
            _cuda_synchronize(device=device)
        torch.cuda.empty_cache()
        times: list[float] = []
        for index in range(trials + discard_first):
            _cuda_synchronize(device=device)
            start = _Event(enable_timing=True)
            end = _Event(enable_timing=True)
            if flusher is not None:
                flusher.flush(device)
            _event_record(start)
            fn(*args)
            _event_record(end)
            _cuda_synchronize(device=device)
            if index >= discard_first:
                times.append(float(_event_elapsed(start, end)))
    return times


# Faithful mode's side-stream probe (KernelBench's timing notes: work on another stream escapes CUDA
# events recorded on the current one; a device-wide synchronize does not let it): kb_drive judges it.
ESCAPE_PROBE_CALLS = 5


def stream_escape_probe(
    fn: Callable[..., Any], args: Sequence[Any], device: torch.device
) -> tuple[float, float]:
    """(event ms, host ms), medians over ESCAPE_PROBE_CALLS untimed calls: events on the current stream
    around `fn`, and host time from before the call to after a device-wide synchronize."""
    events: list[float] = []
    hosts: list[float] = []
    with _no_grad(), torch.cuda.device(device):
        for _ in range(ESCAPE_PROBE_CALLS):
            _cuda_synchronize(device=device)
            start, end = _Event(enable_timing=True), _Event(enable_timing=True)
            started = _perf_counter()
            _event_record(start)
            fn(*args)
            _event_record(end)
            _cuda_synchronize(device=device)
            hosts.append((_perf_counter() - started) * 1000.0)
            events.append(float(_event_elapsed(start, end)))
    return float(statistics.median(events)), float(statistics.median(hosts))


def time_cpu(
    fn: Callable[..., Any], args: Sequence[Any], warmup: int, trials: int, discard_first: int
) -> list[float]:
    """The same loop on CPU with time.perf_counter (no flush: there is no device cache to clear)."""
    with _no_grad():
        for _ in range(warmup):
            fn(*args)
        times: list[float] = []
        for index in range(trials + discard_first):
            started = _perf_counter()
            fn(*args)
            elapsed_ms = (_perf_counter() - started) * 1000.0
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
    if timing.get("method", "cuda_event") != "cuda_event":
        return time_by_method(fn, args, device, timing, flusher)
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


# ------------------------------------------------------------------------------- timing methods
# `eval.timing_method`: KernelBench's four timers (src/kernelbench/timing.py, get_timing_function).
# `cuda_event` is the loop above; the other three are below, each with KernelBench's trial counts,
# warm-up, cache clearing and synchronisation. Every method but `cuda_event` and `host_time` needs a
# CUDA device; `host_time` on a CPU is the perf_counter loop (there is no device to synchronise).

TIMING_METHODS = ("cuda_event", "do_bench", "do_bench_impl", "host_time")
# triton.testing.do_bench's time budgets as KernelBench calls it (warmup=25 ms, rep=100 ms).
DO_BENCH_WARMUP_MS = 25
DO_BENCH_REP_MS = 100


class TimingMethodUnavailable(RuntimeError):
    """The configured timing method cannot run here (no CUDA device, or no triton for do_bench)."""


def method_of(timing: dict[str, Any]) -> str:
    """The request's timing method; absent means KernelBench's default, `cuda_event`."""
    method = str(timing.get("method") or "cuda_event")
    if method not in TIMING_METHODS:
        raise TimingMethodUnavailable(f"unknown timing method {method!r} (expected one of {', '.join(TIMING_METHODS)})")
    return method


def recorded_method(device: torch.device, timing: dict[str, Any]) -> str:
    """What a result records as its timing method: the configured one on a GPU; on a CPU `cuda_event`
    is the perf_counter loop, recorded as `cpu_perf_counter`."""
    method = method_of(timing)
    if device.type != "cuda" and method == "cuda_event":
        return "cpu_perf_counter"
    return method


def _triton() -> Any:
    """triton, with its runtime and testing modules loaded. Imported here: triton is optional, needed
    only by the do_bench methods."""
    try:
        importlib.import_module("triton.runtime")
        importlib.import_module("triton.testing")
        return importlib.import_module("triton")
    except ImportError as exc:
        raise TimingMethodUnavailable(
            f"timing method needs triton (triton.testing.do_bench), which does not import here: {exc}"
        ) from exc


def _needs_cuda(method: str, device: torch.device) -> None:
    if device.type != "cuda":
        raise TimingMethodUnavailable(
            f"timing method {method!r} needs a CUDA device; this worker's device is {device} "
            "(use eval.timing_method = \"cuda_event\" or \"host_time\" on a CPU)"
        )


def time_do_bench(fn: Callable[..., Any], args: Sequence[Any], device: torch.device) -> list[float]:
    """KernelBench's `do_bench`: triton.testing.do_bench(warmup=25, rep=100, return_mode="all"). Triton
    picks the number of calls from its own estimate and clears L2 before each; the warm-up, trial and
    discard settings are not used (as in KernelBench)."""
    _needs_cuda("do_bench", device)
    triton = _triton()
    with _no_grad(), torch.cuda.device(device):
        times = triton.testing.do_bench(
            fn=lambda: fn(*args),
            warmup=DO_BENCH_WARMUP_MS,
            rep=DO_BENCH_REP_MS,
            grad_to_none=None,
            quantiles=None,
            return_mode="all",
        )
    return [float(t) for t in times]


def time_do_bench_impl(
    fn: Callable[..., Any], args: Sequence[Any], device: torch.device, warmup: int, trials: int
) -> list[float]:
    """KernelBench's `do_bench_impl`: Triton's do_bench loop with explicit counts. One call and a
    sync, `warmup` calls and one sync, then per trial Triton's cache clear, start event, fn, end
    event with no sync in between; one sync at the end. Nothing is discarded."""
    _needs_cuda("do_bench_impl", device)
    triton = _triton()
    driver = triton.runtime.driver.active
    with _no_grad(), torch.cuda.device(device):
        fn(*args)
        _cuda_synchronize(device=device)
        cache = driver.get_empty_cache_for_benchmark()
        starts = [_Event(enable_timing=True) for _ in range(trials)]
        ends = [_Event(enable_timing=True) for _ in range(trials)]
        for _ in range(warmup):
            fn(*args)
        _cuda_synchronize(device=device)
        for index in range(trials):
            driver.clear_cache(cache)
            _event_record(starts[index])
            fn(*args)
            _event_record(ends[index])
        _cuda_synchronize(device=device)
        return [float(_event_elapsed(s, e)) for s, e in zip(starts, ends, strict=True)]


def time_host(
    fn: Callable[..., Any],
    args: Sequence[Any],
    device: torch.device,
    warmup: int,
    trials: int,
    discard_first: int,
    flusher: L2Flusher | None,
) -> list[float]:
    """KernelBench's `host_time`: warm-ups each followed by a device sync, empty_cache, then per call
    device sync -> L2 flush -> perf_counter -> fn -> device-wide sync -> perf_counter. The wall clock
    sees work on every stream and the launch overhead. On a CPU: the perf_counter loop."""
    if device.type != "cuda":
        return time_cpu(fn, args, warmup, trials, discard_first)
    with _no_grad(), torch.cuda.device(device):
        for _ in range(warmup):
            fn(*args)
            _cuda_synchronize(device=device)
        torch.cuda.empty_cache()
        times: list[float] = []
        for index in range(trials + discard_first):
            _cuda_synchronize(device=device)
            if flusher is not None:
                flusher.flush(device)
            started = _perf_counter()
            fn(*args)
            _cuda_synchronize(device=device)
            elapsed_ms = (_perf_counter() - started) * 1000.0
            if index >= discard_first:
                times.append(elapsed_ms)
    return times


def time_by_method(
    fn: Callable[..., Any],
    args: Sequence[Any],
    device: torch.device,
    timing: dict[str, Any],
    flusher: L2Flusher,
) -> list[float]:
    """Faithful mode's timer for `timing["method"]` (time_callable for `cuda_event`)."""
    method = method_of(timing)
    flush = flusher if timing["l2_flush"] else None
    if method == "do_bench":
        return time_do_bench(fn, args, device)
    if method == "do_bench_impl":
        return time_do_bench_impl(fn, args, device, timing["warmup"], timing["trials"])
    if method == "host_time":
        return time_host(fn, args, device, timing["warmup"], timing["trials"], timing["discard_first"], flush)
    return time_callable(fn, args, device, timing, flusher)
