"""`op: evaluate`: the worker's side of checking and timing one candidate (`op: prepare` is kb_prepare).

The persistent worker holds what is expensive and trusted: torch, the device context, the reference
data (kb_reference) and the reference's timing. Each candidate runs in its own pre-warmed single-use
process (kb_candidate) from the worker's pool (kb_pool: `Worker`, `run_candidate`), which checks and
times it against the worker's reference data; the worker then
adds the reference timing (in strict mode taken in a single-use process too, served as a candidate's
is: `time_strict_reference`), holds a strict timed result to its own count and clock (kb_strict), adds
the speedup and the excessive-speedup guard (re-timing a flagged candidate in a fresh process on fresh
inputs in strict mode), and writes the response.

KernelBench fidelity (faithful mode) is described in kb_reference and kb_correctness; docs/evaluation.md
lists every deliberate difference.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch

import kb_candidate
import kb_feedback
import kb_memory
import kb_precision
import kb_timing
from kb_candidate import construct_candidate
from kb_correctness import (
    Verdict,
    cache_could_have_caused,
    is_out_of_memory,
    json_safe_metadata,
    other_error_metadata,
    sticky_error,
)
from kb_feedback import CANDIDATE_ERRORS, get_error_name
from kb_pool import LEASE_TRACE, Worker, run_candidate
from kb_reference import (
    DTYPES,
    TOLERANCES,
    CapturedError,
    ProblemContext,
    ReferenceCache,
    ReferenceSpec,
    integer_inputs_policy,
    load_problem,
    reference_mode,
    release_memory,
    select_device,
    set_seed,
    time_reference,
    tolerance,
    tolerance_name,
    trial_seeds,
)
from kb_tensors import (
    hardware_name,
    nbytes,
    poison_free_memory,
    prepare_value,
    same_bytes,
    synchronize,
    tensor_checksum,
)

__all__ = [
    "DTYPES",
    "TOLERANCES",
    "ProblemContext",
    "ReferenceCache",
    "ReferenceSpec",
    "Worker",
    "construct_candidate",
    "evaluate",
    "hardware_name",
    "integer_inputs_policy",
    "is_out_of_memory",
    "load_problem",
    "poison_free_memory",
    "prepare_value",
    "release_memory",
    "same_bytes",
    "select_device",
    "set_seed",
    "sticky_error",
    "synchronize",
    "tensor_checksum",
    "trial_seeds",
]

# The excessive-speedup guard's bound when neither the config nor a roofline gives one. The guard is
# the one threshold for suspicious speedups: its flag is also KernelBench's metadata
# `excessive_speedup` (KernelBench's own 10x is `eval.max_speedup = 10`).
DEFAULT_MAX_SPEEDUP = 50.0
# A timing is wild when its median is more than this many times its fastest call (most calls were
# slowed: something else ran on the device), or its mean more than this many times its median (a
# few calls so slow that they make the mean). krefine's worker/execute.rs applies the same rule to
# candidates; this file to the reference it times.
WILD_SPREAD = 3.0
# Timings of the reference after a wild one, before its steadiest is kept as it is.
WILD_RETIMES = 2

T = TypeVar("T")
# A re-timed speedup confirms the first when it reaches this share of it.
REVERIFY_KEEPS = 0.5


# ------------------------------------------------------------------------------------- the environment


@contextlib.contextmanager
def precision_policy(mode: str, precision: str) -> Iterator[None]:
    """Strict fp32 pins TF32 off (reference and candidate); faithful keeps PyTorch's defaults."""
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    if mode == "strict" and precision == "fp32":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def environment(
    device: torch.device,
    hardware: str,
    precision: str,
    mode: str,
    cast_integers: bool = False,
    inputs: str = "kernelbench",
    request: dict[str, Any] | None = None,
) -> dict[str, Any]:
    timing = request["timing"] if request is not None else {}
    atol, rtol = tolerance(precision, request.get("tolerance") if request is not None else None)
    return {
        "device_name": hardware,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "precision": precision,
        "mode": mode,
        "timing_method": kb_timing.recorded_method(device, timing),
        "tolerance": {"name": tolerance_name(request), "atol": atol, "rtol": rtol},
        "reference_mode": reference_mode(timing),
        "grad_mode": "no_grad",
        "tf32_matmul": bool(torch.backends.cuda.matmul.allow_tf32),
        "tf32_cudnn": bool(torch.backends.cudnn.allow_tf32),
        "integer_inputs": integer_inputs_policy(cast_integers),
        # eval.inputs: where the inputs were drawn ("device" on the CPU device is the same as "kernelbench").
        "inputs": inputs if device.type == "cuda" else "kernelbench",
        "transformers": package_version("transformers"),
        "python": platform.python_version(),
    }


@functools.cache
def package_version(name: str) -> str | None:
    """An installed package's version without importing it (importing transformers takes seconds)."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


# ------------------------------------------------------------------------------------------ evaluate


def evaluate(request: dict[str, Any], worker: Worker) -> dict[str, Any]:
    device = select_device(request)
    spec = ReferenceSpec.of(request)
    precision, mode = spec.precision, spec.mode
    hardware = hardware_name(device)
    # KernelBench sets these print options in every eval; they shape tensor text inside error messages.
    torch.set_printoptions(precision=4, threshold=10, edgeitems=3, linewidth=80)
    verdict = Verdict(metadata={"hardware": hardware, "device": str(device)})
    kb_memory.reset_worker_peak(device)
    _TAIL.clear()
    with precision_policy(mode, precision):
        env = environment(device, hardware, precision, mode, spec.cast_integers, spec.inputs, request)
        verdict = _evaluate_into(verdict, request, worker, device, hardware)
        tail = time.perf_counter()
        verdict = _memory_retries(verdict, request, worker, spec, hardware)
        _record_memory(verdict, worker, spec)
        _spent("memory", tail)
    tail = time.perf_counter()
    worker.warm_spares(request["device"])
    _spent("spares", tail)
    tail = time.perf_counter()
    response = _response(request, verdict, env)
    _spent("response", tail)
    if os.environ.get(LEASE_TRACE):
        _trace_tail(request)
    ctx = worker.references.contexts.get(spec.key())
    probe = getattr(ctx, "precision_probe", None)
    if isinstance(probe, kb_precision.Probe) and not probe.from_hint:
        # Made here, by the worker (never a field a candidate's process sends): the orchestrator keeps
        # it for the next run on this kind of device (src/worker/probes.rs).
        response["precision_probe"] = probe.wire()
    return response


# ---------------------------------------------------------------------------------- device memory


def _memory_retries(
    verdict: Verdict, request: dict[str, Any], worker: Worker, spec: ReferenceSpec, hardware: str
) -> Verdict:
    """Memory is the machine's and krefine's to manage (kb_memory): an evaluation that ran out of memory
    where krefine's cached data may have been in the way is evaluated once more without it."""
    cache, device = worker.references, spec.device
    if verdict.metadata.get("reference_out_of_memory"):
        # The reference, not the candidate, ran out of memory. Unless the problem itself is too large
        # for the device, that is krefine's doing (its caches, its buffers beside them, its allocator's
        # fragments): free everything (this problem's data stays off the device when no cache held
        # any) and evaluate once more.
        freed = cache.evict_for_retry(spec)
        if freed > 0 or not kb_memory.problem_does_not_fit(cache.memory_figures(spec), True, False):
            verdict = Verdict(metadata={"hardware": hardware, "device": str(device)})
            verdict = _evaluate_into(verdict, request, worker, device, hardware)
            verdict.metadata["reference_retried_after_eviction"] = freed
    if cache_could_have_caused(verdict, cache.device_bytes(device), device):
        # KernelBench holds no reference data on the device between trials; a candidate must not
        # fail for memory that our cache took. Free it and evaluate once more.
        spent = dict(verdict.phases)
        cache.move_off_device(spec)
        verdict = Verdict(metadata={"hardware": hardware, "device": str(device)})
        verdict = _evaluate_into(verdict, request, worker, device, hardware)
        verdict.metadata["retried_without_device_cache"] = True
        verdict.metadata["first_try_s"] = round(sum(spent.values()), 3)
        verdict.feedback.append(
            "(Evaluated a second time with the cached reference data moved off the device, after "
            "the first attempt ran out of memory.)"
        )
    return verdict


def _record_memory(verdict: Verdict, worker: Worker, spec: ReferenceSpec) -> None:
    """On a CUDA device, the memory figures in the result (`metadata.device_memory`: the problem's
    footprint, the candidate's estimated working set, what krefine held, the worker's peak). A problem
    that does not fit the device is said so plainly, as a reference error that is not the candidate's
    fault: its reference ran out of memory with krefine's caches given way, or a candidate ran out
    where KernelBench's own flow would not fit either (`Footprint.kernelbench`)."""
    if spec.device.type != "cuda":
        return
    numbers = worker.references.memory_figures(spec)
    numbers["worker_peak_bytes"] = kb_memory.worker_peak(spec.device)
    verdict.metadata["device_memory"] = numbers
    reference_failed = bool(verdict.metadata.get("reference_out_of_memory"))
    candidate_failed = verdict.status == "out_of_memory" and not verdict.sticky
    if not kb_memory.problem_does_not_fit(numbers, reference_failed, candidate_failed):
        if reference_failed:
            verdict.metadata["krefine_out_of_memory"] = True
            verdict.feedback.append(kb_memory.unexplained_out_of_memory(numbers))
        return
    verdict.status, verdict.correctness = "reference_error", False
    verdict.metadata["problem_does_not_fit"] = True
    verdict.feedback.append(kb_memory.does_not_fit(numbers, reference_failed))


def _job(request: dict[str, Any], hardware: str, kind: str) -> dict[str, Any]:
    """What a candidate process needs besides the reference data it asks the worker for."""
    return {
        "kind": kind,
        "source": request["candidate"]["source"],
        "build_dir": request["candidate"]["build_dir"],
        "device": request["device"],
        "precision": request["precision"],
        "mode": request["mode"],
        "seed": request["seed"],
        "trials": request["correct_trials"],
        "timing": request["timing"],
        "tolerance": request.get("tolerance"),
        "hardware": hardware,
        # The settings the reference ran with; the candidate process sets them before the import.
        "settings": kb_candidate.settings_snapshot(),
    }


def _record_strict_timing(verdict: Verdict, strict_ref: dict[str, Any] | None) -> None:
    """The regimes the candidate's and the reference's strict times were taken under, side by side."""
    regime = verdict.metadata.get("strict_timing")
    if regime is None or "candidate" in regime:
        return
    verdict.metadata["strict_timing"] = {
        "candidate": regime,
        "reference": strict_ref,
        "reference_timed_in": "process"
        if strict_ref is not None
        else f"not timed by this worker ({verdict.ref_runtime_source or 'no reference time'})",
    }


def _evaluate_into(
    verdict: Verdict, request: dict[str, Any], worker: Worker, device: torch.device, hardware: str
) -> Verdict:
    mode = request["mode"]
    started = time.perf_counter()
    ctx = worker.references.context(ReferenceSpec.of(request))
    reference_s = time.perf_counter() - started
    if ctx.error is not None:  # KernelBench builds the reference before loading the candidate
        verdict.phases["reference_s"] = reference_s
        _reference_failed(verdict, ctx.error, hardware, device)
        hint = kb_feedback.hf_offline_hint(ctx.error.exc, request["problem"]["code"])
        if hint is not None:
            verdict.feedback.append(hint)
        return verdict
    verdict = run_candidate(worker, _job(request, hardware, "evaluate"), ctx)
    verdict.phases["reference_s"] += reference_s
    tail = time.perf_counter()
    if verdict.reference_failure is not None:
        trials, index = verdict.reference_failure
        entry = ctx.trials[trials][index]
        assert entry is not None and entry.error is not None
        _reference_failed(verdict, entry.error, hardware, device)
    elif verdict.runtime_stats:
        started = time.perf_counter()
        reference_timing(verdict, request, worker, ctx)
        verdict.phases["ref_timing_s"] = time.perf_counter() - started
        if mode == "strict":
            strict_ref = worker.strict_references.get(reference_timing_key(request, ctx))
            _record_strict_timing(verdict, strict_ref)
        if verdict.runtime_stats:
            _add_timing_feedback(verdict)
            _guard_speedup(verdict, request, worker, ctx, hardware)
    _spent("reference", tail)
    if not verdict.sticky:
        # Its two steps timed apart in the lease trace: the collection (what this job made), then the
        # cache given back (the device synchronised, its segments freed).
        release_memory(device, lambda step, since: _spent(f"release_{step}", since))
    return verdict


# What the worker does for an evaluation after the candidate's job (whose lease trace line
# kb_pool.run_candidate writes) and before it answers: the reference's timing, the speedup guard,
# memory given back, spares warmed, the response. Seconds by step, one `tail` trace line per job.
_TAIL: dict[str, float] = {}


def _spent(step: str, since: float) -> None:
    _TAIL[step] = _TAIL.get(step, 0.0) + time.perf_counter() - since


def _trace_tail(request: dict[str, Any]) -> None:
    steps = " ".join(f"tail_{k}={v:.3f}" for k, v in sorted(_TAIL.items()))
    build = os.path.basename(str(request["candidate"]["build_dir"]))
    print(
        f"krefine harness: lease trace at={time.time():.3f} tail {build} - total={sum(_TAIL.values()):.3f} | {steps}",
        file=sys.stderr,
    )


def _reference_failed(verdict: Verdict, error: CapturedError, hardware: str, device: torch.device) -> None:
    # The full traceback is for whoever maintains the problem set: the worker log, not the prompt.
    print(f"krefine harness: the reference failed ({error.stage}):\n{error.traceback_text}", file=sys.stderr)
    verdict.status = "reference_error"
    if error.stage == "forward":
        # Escapes run_and_check_correctness in KernelBench: outer catch, compiled=True, untruncated.
        verdict.compiled = True
        verdict.metadata["runtime_error"] = str(error.exc)
        verdict.metadata["runtime_error_name"] = get_error_name(error.exc)
    else:
        verdict.compiled = False
        verdict.metadata = other_error_metadata(error.exc, hardware, device)
    if is_out_of_memory(error.exc):
        # Memory is the machine's and krefine's to manage, never the candidate's: evaluate retries once
        # after freeing krefine's caches, and the verdict stays the reference's.
        verdict.metadata["reference_out_of_memory"] = True
    verdict.feedback.append(
        "The reference PyTorch Model itself failed on this machine (this is not your code's fault), "
        f"so the candidate cannot be checked.\n{kb_feedback.exception_line(error.exc)}"
    )


# ------------------------------------------------------------------------------------ reference timing


def reference_timing_key(request: dict[str, Any], ctx: ProblemContext) -> tuple[Any, ...]:
    """What a cached reference timing is keyed by (kept across the eviction of its context)."""
    timing = request["timing"]
    return (
        ReferenceCache.code_key(request["problem"]["code"]),
        str(ctx.device),
        ctx.precision,
        ctx.mode,
        ctx.seed,
        ctx.cast_integers,
        timing["warmup"],
        timing["trials"],
        timing["discard_first"],
        timing["l2_flush"],
        timing.get("method", "cuda_event"),
        reference_mode(timing),
    )


def reference_timing_needed(request: dict[str, Any], worker: Worker, ctx: ProblemContext) -> bool:
    """Would `reference_timing` time the reference (no baseline given, none cached)?"""
    if request.get("reference_runtime"):
        return False
    return reference_timing_key(request, ctx) not in worker.references.ref_timings


def reference_timing(verdict: Verdict, request: dict[str, Any], worker: Worker, ctx: ProblemContext) -> None:
    """The reference's runtime stats into `verdict`: from the request's baseline, the cache, or timed
    now (reference work: not charged to a candidate) and cached."""
    given = request.get("reference_runtime")
    if given:
        verdict.ref_runtime_stats = {k: v for k, v in given.items() if k != "source"}
        verdict.ref_runtime_source = given["source"]
        return
    key = reference_timing_key(request, ctx)
    cached = worker.references.ref_timings.get(key)
    if cached is not None:
        verdict.ref_runtime_stats, verdict.ref_runtime_source = dict(cached), "cached"
        return
    try:
        inputs_key = ctx.seed + kb_candidate.STRICT_REFERENCE_KEY_OFFSET
        if ctx.mode == "strict":
            stats, strict_ref = steadiest(
                lambda: time_strict_reference(request, worker, ctx, inputs_key, every=False), lambda r: r[0]
            )
            worker.strict_references[key] = strict_ref
        else:
            worker.settle_spares()  # nothing starting on the device while the reference is timed here
            stats = steadiest(
                lambda: kb_timing.runtime_stats(time_reference(ctx, request["timing"], worker.flusher, inputs_key)),
                lambda s: s,
            )
    except ReferenceUntimed as exc:
        verdict.feedback.append(f"(The reference could not be timed: {exc})")
        return
    except CANDIDATE_ERRORS as exc:
        verdict.feedback.append(f"(The reference could not be timed: {kb_feedback.exception_line(exc)})")
        return
    worker.references.ref_timings[key] = stats
    verdict.ref_runtime_stats, verdict.ref_runtime_source = dict(stats), "measured"


def _reference_job(request: dict[str, Any], ctx: ProblemContext, build_dir: str) -> dict[str, Any]:
    """A strict reference-timing job: a candidate's job (`_job`) whose code is the problem's own."""
    return {
        **_job(request, hardware_name(ctx.device), "reference"),
        "reference_code": request["problem"]["code"],
        "reference_compile": request["timing"].get("reference_compile"),
        "source": "",
        "build_dir": build_dir,
    }


class ReferenceUntimed(RuntimeError):
    """Strict mode's reference timing process gave no time (its reason is the message)."""


def time_strict_reference(
    request: dict[str, Any], worker: Worker, ctx: ProblemContext, key: int | None, every: bool
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Strict mode's reference time (stats) and its regime. Taken as a candidate's is, so that identical
    code gets a speedup of 1 up to noise: in a single-use process driven by this worker (kb_drive: the
    same loop, clock, inputs from `key`, checks of every call when `every`, as the candidate's re-time
    has). There is no other way to time it: a reference that cannot be timed so stays untimed
    (ReferenceUntimed), since a time taken in another regime would bias the speedup."""
    build_dir = tempfile.mkdtemp(prefix="krefine-reference-")
    try:
        with ctx.cache.reference_work():
            run = run_candidate(worker, _reference_job(request, ctx, build_dir), ctx, key=key, every=every)
    finally:
        shutil.rmtree(build_dir, ignore_errors=True)
    if run.status == "correct" and run.runtime_stats:
        return dict(run.runtime_stats), dict(run.metadata.get("strict_timing") or {})
    why = "; ".join(run.feedback[-1:]) or run.status
    raise ReferenceUntimed(f"strict timing of the reference in its own process failed: {why}")


def timing_spread(stats: dict[str, Any]) -> float:
    """How wild a timing is: the larger of median / fastest call and mean / median (1.0: steady)."""
    fastest, median, mean = float(stats["min"]), float(stats.get("median", stats["mean"])), float(stats["mean"])
    if fastest <= 0 or median <= 0:
        return 1.0
    return max(median / fastest, mean / median)


def steadiest(measure: Callable[[], T], stats_of: Callable[[T], dict[str, Any]]) -> T:
    """`measure()`; while what it measured is wild (`WILD_SPREAD`), measure again, at most
    `WILD_RETIMES` times, and keep the steadiest. A reference timed while something else ran on the
    device would otherwise set every candidate's speedup of the problem on this worker."""
    best = measure()
    for _ in range(WILD_RETIMES):
        if timing_spread(stats_of(best)) <= WILD_SPREAD:
            break
        again = measure()
        if timing_spread(stats_of(again)) < timing_spread(stats_of(best)):
            best = again
    return best


def _add_timing_feedback(verdict: Verdict) -> None:
    stats, ref = verdict.runtime_stats, verdict.ref_runtime_stats
    ref_mean = ref.get("mean") if ref else None
    verdict.feedback.append(
        kb_feedback.timing_sentence(stats["mean"], stats["median"], stats["std"], stats["num_trials"], ref_mean)
    )


# ------------------------------------------------------------------------------- excessive speedups


def roofline_ms(ctx: ProblemContext, integrity: dict[str, Any]) -> float | None:
    """The least time the reference's work can take on this device: FLOPs (torch's flop counter on one
    reference forward) at the peak rate, or its inputs and outputs moved once at the peak bandwidth,
    whichever is longer. None without peak numbers or without any work counted."""
    peak_tflops, peak_gbs = integrity.get("peak_tflops"), integrity.get("peak_bandwidth_gbs")
    if not peak_tflops and not peak_gbs:
        return None
    cached = getattr(ctx, "roofline_work", None)
    if cached is None:
        from torch.utils.flop_counter import FlopCounterMode

        assert ctx.ref_model is not None
        inputs = ctx.timing_inputs()
        counter = FlopCounterMode(display=False)
        with ctx.cache.reference_work(), torch.no_grad(), counter:
            output = ctx.ref_model(*inputs)
        cached = (float(counter.get_total_flops()), float(nbytes(inputs) + nbytes(output)))
        ctx.roofline_work = cached  # type: ignore[attr-defined]
    flops, moved = cached
    floor = 0.0
    if peak_tflops and flops > 0:
        floor = max(floor, flops / (peak_tflops * 1e12))
    if peak_gbs and moved > 0:
        floor = max(floor, moved / (peak_gbs * 1e9))
    return floor * 1e3 if floor > 0 else None


def speedup_bound(ctx: ProblemContext, integrity: dict[str, Any], ref_ms: float) -> tuple[float, str]:
    """(bound, source): `eval.max_speedup` when set, else the roofline's, else DEFAULT_MAX_SPEEDUP."""
    configured = integrity.get("max_speedup")
    if configured:
        return float(configured), "config"
    try:
        floor = roofline_ms(ctx, integrity)
    except CANDIDATE_ERRORS as exc:  # a reference the flop counter cannot run: no roofline
        print(f"krefine harness: no roofline for this reference: {exc!r}", file=sys.stderr)
        floor = None
    if floor:
        return max(1.0, ref_ms / floor), "roofline"
    return DEFAULT_MAX_SPEEDUP, "default"


def _guard_speedup(
    verdict: Verdict, request: dict[str, Any], worker: Worker, ctx: ProblemContext, hardware: str
) -> None:
    """Flag a speedup above the bound; in strict mode re-time the candidate in a fresh process with new
    secrets, every timed output checked (the reference re-timed on fresh inputs too) before the speedup
    counts."""
    ref_mean = verdict.ref_runtime_stats.get("mean") if verdict.ref_runtime_stats else None
    new_mean = verdict.runtime_stats.get("mean")
    if not ref_mean or not new_mean or new_mean <= 0 or verdict.status != "correct":
        return
    speedup = float(ref_mean) / float(new_mean)
    bound, source = speedup_bound(ctx, request.get("integrity") or {}, float(ref_mean))
    check: dict[str, Any] = {
        "bound": bound,
        "bound_source": source,
        "flagged": speedup > bound,
        "verified": None,
        "reverified_speedup": None,
    }
    verdict.speedup_check = check
    if not check["flagged"]:
        return
    verdict.metadata["excessive_speedup"] = True
    if ctx.mode != "strict":
        verdict.feedback.append(
            f"Warning: the speedup {speedup:.1f}x is above what this problem's reference allows on this "
            f"device ({bound:.1f}x, {source}); it is flagged in the results. Make sure the kernel computes "
            "the full result on every call (no caching, no skipped work, no side streams)."
        )
        return
    # A new process, new secrets (inputs and checks), every timed call checked; the reference re-timed
    # on inputs of its own secret seed.
    retimed = run_candidate(worker, _job(request, hardware, "retime"), ctx)
    verdict.findings.extend(f for f in retimed.findings if f not in verdict.findings)
    ref_stats: dict[str, Any] = {}
    if retimed.status == "correct" and retimed.runtime_stats:
        # The reference re-timed as the candidate was: a fresh secret, every call checked.
        try:
            ref_stats, _ = time_strict_reference(request, worker, ctx, None, every=True)
        except ReferenceUntimed as exc:
            retimed.feedback.append(str(exc))
    new = retimed.runtime_stats.get("mean") if retimed.status == "correct" else None
    reverified = None
    if new and ref_stats:
        reverified = float(ref_stats["mean"]) / float(new)
    check["reverified_speedup"] = reverified
    check["verified"] = reverified is not None and reverified >= REVERIFY_KEEPS * speedup
    verdict.phases["ref_timing_s"] += retimed.phases.get("timing_s", 0.0)
    if check["verified"]:
        verdict.feedback.append(
            f"The speedup {speedup:.1f}x is above this problem's bound ({bound:.1f}x, {source}); re-timed in "
            f"a fresh process on fresh inputs it measured {reverified:.1f}x, so it counts."
        )
    else:
        reason = (
            f"measured {reverified:.1f}x" if reverified is not None else "; ".join(retimed.feedback[-1:]) or "failed"
        )
        verdict.feedback.append(
            f"The speedup {speedup:.1f}x is above this problem's bound ({bound:.1f}x, {source}) and was not "
            f"confirmed when re-timed in a fresh process on fresh inputs ({reason}); it does not count."
        )


# ------------------------------------------------------------------------------------------ response


def _response(request: dict[str, Any], verdict: Verdict, env: dict[str, Any]) -> dict[str, Any]:
    stats, ref = verdict.runtime_stats, verdict.ref_runtime_stats
    runtime = float(stats["mean"]) if stats else -1.0
    ref_runtime = float(ref["mean"]) if ref else -1.0
    speedup = ref_runtime / runtime if stats and ref and runtime > 0 else None
    pinned = verdict.env.get("pinned") or {}
    env = dict(env)
    # What the candidate ran with: the settings krefine pinned in its process (the reference's).
    env["tf32_matmul"] = pinned.get("tf32_matmul", env["tf32_matmul"])
    env["tf32_cudnn"] = pinned.get("tf32_cudnn", env["tf32_cudnn"])
    env["settings"] = json_safe_metadata(pinned) if pinned else None
    env["sandbox"] = json_safe_metadata(verdict.env.get("sandbox"))
    env["isolation"] = verdict.env.get("isolation", "in_worker")
    phases = {k: round(v, 6) for k, v in verdict.phases.items()}
    phases.setdefault("isolation_s", 0.0)
    phases.setdefault("spawn_wait_s", 0.0)
    return {
        "id": request["id"],
        "ok": True,
        "kind": "evaluate",
        "status": verdict.status,
        "compiled": verdict.compiled,
        "correctness": verdict.correctness,
        "metadata": json_safe_metadata(verdict.metadata),
        "runtime": runtime,
        "runtime_stats": stats,
        "ref_runtime": ref_runtime,
        "ref_runtime_stats": ref,
        "ref_runtime_source": verdict.ref_runtime_source if ref else None,
        "speedup": speedup,
        "feedback": "\n".join(verdict.feedback),
        "env": env,
        "phases": phases,
        "sticky": verdict.sticky,
        "findings": verdict.findings,
        "speedup_check": verdict.speedup_check,
    }
