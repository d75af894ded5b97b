"""Timing, structured as KernelBench's `cuda_event` timer (src/kernelbench/timing.py), with two recorded
differences: both reference and candidate run under `torch.no_grad()` (env.grad_mode = "no_grad"), and
the 256 MiB L2-flush buffer is allocated once per process and refilled instead of re-allocated per trial.
Statistics keep full precision (KernelBench rounds to 3 significant digits; Rust can do that itself).

Every clock and event function is captured when this module is imported, which in a candidate process
is before the candidate's code is: a candidate that replaces `time.perf_counter` or
`torch.cuda.Event.elapsed_time` changes nothing here (and kb_candidate reports that it tried).

Strict mode times differently (`time_strict`): each timed call gets inputs no call has seen (made
outside the timed region by the worker from a secret seed, kb_strict), the timed region ends with a
device-wide synchronize (work the candidate left on other streams is inside the measurement), and after
each call its output goes to the worker, which decides from another secret whether to check it against
the reference's, so neither a memo nor skipping work on unchecked calls can pass reliably. Its timed
calls run in a native loop (kb_native, kb_native_timer.cpp): the call index, the events, the clock and
the times are never in a Python frame or object the candidate's forward could reach.
"""

from __future__ import annotations

import importlib
import math
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

import kb_native

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


class TimedOutputMismatch(Exception):
    """Strict timing: the output of a timed call did not match the reference for its inputs."""

    def __init__(self, call: int, problem: str) -> None:
        super().__init__(f"timed call {call}: {problem}")
        self.call = call
        self.problem = problem


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
# events recorded on the current one; a device-wide synchronize does not let it). A call is flagged when
# the host waited, to a device-wide synchronize, at least ESCAPE_MIN_MS and ESCAPE_RATIO times longer
# than its events measured.
ESCAPE_PROBE_CALLS = 3
ESCAPE_MIN_MS = 0.5
ESCAPE_RATIO = 2.0


def escaped(event_ms: float, host_ms: float) -> bool:
    """True when the device-wide time says more work ran than the candidate stream's events saw."""
    return host_ms - event_ms >= ESCAPE_MIN_MS and host_ms >= ESCAPE_RATIO * event_ms


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


# Faithful mode's fresh-input probe (kb_candidate.fresh_probe): after KernelBench's loop, PROBE_CALLS
# calls on inputs no call has seen. On the GPU their fastest is compared with the timed median: at least
# PROBE_MIN_MS and PROBE_RATIO times slower says the timed calls skipped work or hit a memo.
PROBE_CALLS = 3
PROBE_MIN_MS = 0.05
PROBE_RATIO = 3.0


def faster_than_fresh(timed_median_ms: float, fresh_ms: float) -> bool:
    """True when a call on fresh inputs took much longer than KernelBench's timed calls did."""
    return fresh_ms - timed_median_ms >= PROBE_MIN_MS and fresh_ms >= PROBE_RATIO * timed_median_ms


def time_one(fn: Callable[..., Any], args: Sequence[Any], device: torch.device) -> tuple[Any, float]:
    """One call timed as strict mode times it (device-wide fence on the GPU): (output, ms)."""
    with _no_grad():
        if device.type != "cuda":
            started = _perf_counter()
            output = fn(*args)
            return output, (_perf_counter() - started) * 1000.0
        with torch.cuda.device(device):
            _cuda_synchronize(device=device)
            start, end = _Event(enable_timing=True), _Event(enable_timing=True)
            _event_record(start)
            output = fn(*args)
            _cuda_synchronize(device=device)
            _event_record(end)
            _cuda_synchronize(device=device)
            return output, float(_event_elapsed(start, end))


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


def _fresh(value: Any) -> Any:
    if type(value) is torch.Tensor:
        return _clone(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_fresh(item) for item in value)
    return value


class TimingHooked(Exception):
    """Strict timing: a trace/profile function, a sys.monitoring tool or a gc callback was installed
    during the native loop (kb_native_timer.cpp), letting code other than forward run inside it."""

    def __init__(self, call: int, message: str) -> None:
        super().__init__(message)
        self.call = call
        self.message = message


def time_strict(
    fn: Callable[..., Any],
    warmup_inputs: Callable[[], Sequence[Any]],
    call_inputs: Callable[[int], Sequence[Any]],
    device: torch.device,
    timing: dict[str, Any],
    flusher: L2Flusher,
    after: Callable[[int, Any, int], str | None] | None,
) -> list[float]:
    """Strict mode's loop (module doc): warm-ups here on clones of one set (untimed, unchecked); then the
    timed calls in the native loop (kb_native): per call its own inputs (`call_inputs(call)`, made
    before the timed region), device sync -> L2 flush -> start -> fn -> device-wide sync -> end, and
    `after(call, output, calls)` (the worker's check: a problem, which raises TimedOutputMismatch, or
    None). The call index, the events, the clock and the times live in native memory until the loop
    ends. The reference is timed the same way, by the same caller (kb_candidate.strict_times) in a
    process of its own served by the worker, so the ratio compares like with like.
    Raises kb_native.NativeTimerUnavailable when the native loop is not loaded: no Python fallback."""
    warmup, trials, discard = timing["warmup"], timing["trials"], timing["discard_first"]
    cuda = device.type == "cuda"
    kb_native.require()
    flush = (lambda: flusher.flush(device)) if cuda and timing["l2_flush"] else None
    with _no_grad(), torch.cuda.device(device) if cuda else _no_grad():
        if warmup:
            warm = warmup_inputs()
            for _ in range(warmup):
                fn(*_fresh(warm))
                if cuda:
                    _cuda_synchronize(device=device)
            del warm
        stream = None
        if cuda:
            torch.cuda.empty_cache()
            stream = int(torch.cuda.current_stream(device).cuda_stream)
        times, stop = kb_native.run(fn, call_inputs, after, trials + discard, discard, stream, flush)
    if stop is not None:
        call, kind, message = stop
        if kind == "mismatch":
            raise TimedOutputMismatch(call, message)
        raise TimingHooked(call, message)
    return list(times)


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
