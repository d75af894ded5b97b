"""`op: prepare`: build a problem's reference data ahead of its candidates, step by step.

The orchestrator asks for it as soon as a problem's first answer is being generated (src/refprep/),
one step at a time and only while the device is idle, so that the data is ready when the first
candidate arrives and no candidate waits behind a long preparation. The steps, in the order a candidate
needs them: the correctness trials one by one (each: inputs made after `set_seed(trial seed)`, the
reference forward, placement in the cache), then the timing inputs, then the reference timing. The
reference model itself is built by the first request and counts as no step.

Everything built here is exactly what a candidate's own check would build on first use (kb_reference):
the same seeds, the same order of operations, the same cache entries. A request without `steps` builds
everything (the old behaviour, kept for tools and tests).

A step cannot be interrupted, and a candidate that arrives during one waits for it. Timing the reference
is the one step whose length is not bounded by the problem's inputs (warm-ups plus every timed call):
when the trials' reference forwards say it would hold the device longer than BACKGROUND_TIMING_MAX_S, a
stepwise preparation leaves it to the first correct candidate's evaluation, where KernelBench times the
reference too (on the CPU device a 200 MB ReLU takes 20 s of timing; on the H100, 6 GB take 0.5 s).
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from typing import Any, Literal

import torch

import kb_feedback
import kb_memory
from kb_correctness import Verdict, is_out_of_memory
from kb_eval import Worker, precision_policy, reference_timing, reference_timing_needed
from kb_reference import CapturedError, ProblemContext, ReferenceSpec, release_memory, select_device

Step = Literal["trial", "timing_inputs", "reference_timing"]
# The longest a stepwise preparation may hold the device to time the reference (see the module doc).
BACKGROUND_TIMING_MAX_S = 2.0


def prepare(request: dict[str, Any], worker: Worker) -> dict[str, Any]:
    """`_prepare_once`, once more when the reference ran out of memory, after krefine's caches were
    freed, unless the problem itself is too large for the device (kb_eval._memory_retries' rule):
    krefine's caches never make a reference fail."""
    answer = _prepare_once(request, worker)
    if answer.pop("out_of_memory", False):
        select_device(request)
        spec = ReferenceSpec.of(request)
        freed = worker.references.evict_for_retry(spec)
        if freed > 0 or not kb_memory.problem_does_not_fit(worker.references.memory_figures(spec), True, False):
            print(
                f"krefine harness: the reference ran out of memory; freed {freed} bytes of cached reference "
                "data and prepared it again",
                file=sys.stderr,
            )
            answer = _prepare_once(request, worker)
            answer.pop("out_of_memory", None)
    return answer


def _prepare_once(request: dict[str, Any], worker: Worker) -> dict[str, Any]:
    """Build at most `steps` steps of the problem's reference data (all when absent). With `quiet`
    false the reference is not timed (the orchestrator has not quieted the CPU yet): the response
    then names `reference_timing` as the next step. Cheap when everything is cached already."""
    device = select_device(request)
    worker.warm_spares(request["device"])
    spec = ReferenceSpec.of(request)
    limit: int | None = request.get("steps")
    quiet = bool(request.get("quiet", True))
    started = time.perf_counter()
    built: list[str] = []
    parallel = 0
    with precision_policy(spec.mode, spec.precision):
        ctx = worker.references.context(spec)
        error = ctx.error

        def room() -> bool:
            return limit is None or len(built) < limit

        trials = request["correct_trials"]
        if error is None and room() and ctx.built_trials(trials) < trials:
            parallel = ctx.pregenerate(request["problem"]["code"], _unbuilt_seeds(ctx, request))
        if error is None:
            error = _build_trials(ctx, trials, room, built)
        step = _next_step(request, worker, ctx, error)
        if step == "timing_inputs" and room():
            ctx.timing_inputs()
            built.append("timing inputs")
            step = _next_step(request, worker, ctx, error)
        if step == "reference_timing" and limit is not None and not _short_timing(ctx, request["timing"]):
            step = None  # left to the first correct candidate
        if step == "reference_timing" and room() and quiet:
            # A failure is cached nowhere: evaluate tries again and says so in its feedback.
            reference_timing(Verdict(), request, worker, ctx)
            built.append("reference timing")
            step = None
        tiers = [e.tier for entries in ctx.trials.values() for e in entries if e is not None]
        device_bytes, host_bytes = ctx.device_bytes, ctx.host_bytes
        if step is None:
            ctx.pregenerated.clear()  # left over only if a trial failed; do not hold shared memory
        ready = ctx.built_trials(trials) if ctx.error is None else 0
    if step is None and built:
        release_memory(device)  # once, at the end (a garbage collection per step costs 0.1 s)
    return {
        "id": request["id"],
        "ok": True,
        "kind": "prepare",
        "status": "ready" if error is None else "reference_error",
        "seconds": round(time.perf_counter() - started, 6),
        "tiers": tiers,
        "device_bytes": device_bytes,
        "host_bytes": host_bytes,
        "parallel_inputs": parallel,
        "feedback": "" if error is None else kb_feedback.exception_line(error.exc),
        # Popped by `prepare` (not part of the answer).
        "out_of_memory": error is not None and is_out_of_memory(error.exc),
        "done": step is None,
        "next": step,
        "trials_ready": ready,
        "built": built,
    }


def _build_trials(ctx: ProblemContext, trials: int, room: Callable[[], bool], built: list[str]) -> CapturedError | None:
    """Build the next trials in order while there is room; the first reference failure stops."""
    with torch.no_grad():
        for index, trial_seed in enumerate(ctx.trial_seeds(trials)):
            done = index < ctx.built_trials(trials)
            if not done and not room():
                return None
            entry = ctx.entry(trials, index, trial_seed)
            if not done:
                built.append(f"trial {index + 1}")
            if entry.error is not None:
                return entry.error
    return None


def _next_step(
    request: dict[str, Any], worker: Worker, ctx: ProblemContext, error: CapturedError | None
) -> Step | None:
    """What a later request would build first; None when nothing is left (or the reference failed)."""
    if error is not None:
        return None
    trials = request["correct_trials"]
    if ctx.built_trials(trials) < trials:
        return "trial"
    if not request["timing"]["measure"]:
        return None
    if ctx.timing_inputs_cache is None:
        return "timing_inputs"
    if reference_timing_needed(request, worker, ctx):
        return "reference_timing"
    return None


def _short_timing(ctx: ProblemContext, timing: dict[str, Any]) -> bool:
    """Would timing the reference take at most BACKGROUND_TIMING_MAX_S, by the trials' forwards?"""
    if not ctx.forward_seconds:
        return False
    calls = timing["warmup"] + timing["trials"] + timing["discard_first"]
    return bool(statistics.median(ctx.forward_seconds) * calls <= BACKGROUND_TIMING_MAX_S)


def _unbuilt_seeds(ctx: ProblemContext, request: dict[str, Any]) -> list[int]:
    """The seeds whose inputs are still to be made: trials not built yet, then the timing inputs.
    (Made at once in parallel processes when they are large, see kb_inputs; a later step uses them.)"""
    trials = request["correct_trials"]
    entries = ctx.trials.get(trials, [None] * trials)
    seeds = [s for s, e in zip(ctx.trial_seeds(trials), entries, strict=True) if e is None]
    if request["timing"]["measure"] and ctx.timing_inputs_cache is None and ctx.seed not in seeds:
        seeds.append(ctx.seed)
    return seeds
