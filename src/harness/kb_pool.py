"""The worker's pool of single-use candidate processes, and one job run through it.

`Worker` keeps what a worker holds between requests: the reference data (kb_reference's
ReferenceCache), strict reference timings, the L2 flusher, and the warm candidate processes
(kb_process) that take one job each and exit. `run_candidate` runs one job (a candidate's
evaluation, its strict re-time, the reference's strict timing) in a fresh process, or in this one
for the harness's unit tests, with strict mode's session held by the worker (kb_strict): a strict
result that claims more trials or timed calls than the worker served is refused as forged, and the
time the worker spent on the reference meanwhile is booked as reference time. A message on the pipe
the harness never sends fails the candidate (kb_wire). `profile_isolated` runs `op: profile` in such
a process. kb_eval builds on this: what to run, the reference's timing, the speedup guard, the
response.
"""

from __future__ import annotations

import multiprocessing.util
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import kb_candidate
import kb_profile
import kb_strict
import kb_timing
import kb_wire
from kb_correctness import Verdict
from kb_process import BadFork, CandidateProcess, ChildDied
from kb_reference import ProblemContext, ReferenceCache, select_device, tolerance

# A candidate process still alive this long after its result is killed (it should exit at once).
RETIRED_GRACE_S = 5.0
# Warm candidate processes kept per device. On a GPU three, and a replacement starts warming as soon
# as one is taken: a forked process needs about 0.4 s for its CPU step and 0.2-0.5 s for its CUDA
# context on the H200, a candidate about 0.8 s, so back-to-back candidates rarely wait. On the CPU one,
# started after a result so that warming never competes with a candidate being timed on the same cores.
SPARES = {"cuda": 3, "cpu": 1}
# How long settle_spares waits for one spare's device step (a CUDA context takes well under a second).
SPARE_START_TIMEOUT_S = 60.0


class Worker:
    """State a worker keeps between requests. `isolate=False` runs candidates in this process (only
    for the harness's own unit tests of the checking logic: state then leaks between candidates)."""

    def __init__(self, isolate: bool = True) -> None:
        self.references = ReferenceCache()
        # Strict reference timings, keyed as ReferenceCache.ref_timings (reference_timing_key).
        self.strict_references: dict[tuple[Any, ...], kb_strict.StrictReference] = {}
        self.flusher = kb_timing.L2Flusher()
        self.isolate = isolate
        self.spares: list[CandidateProcess] = []
        # Processes that were handed a job; they exit by themselves and are reaped on the next take.
        self.retired: list[CandidateProcess] = []
        # A candidate process that died: by default the worker ends the same way (see ChildDied).
        self.on_child_death = ChildDied.reproduce
        self.processes_started = 0
        self.warned_preload = False
        # How candidate processes start: forked from a torch-preloaded server, or spawned (fallback).
        self.start_method = "forkserver"
        multiprocessing.util.Finalize(self, _kill_all, args=(self.spares,), exitpriority=10)
        multiprocessing.util.Finalize(self, _kill_all, args=(self.retired,), exitpriority=10)

    def take_process(self, device: str) -> tuple[CandidateProcess, float]:
        """A warm candidate process for `device` and how long we waited for it to be ready."""
        self.reap()
        started = time.perf_counter()
        self.grant_spares()  # nothing is timed between jobs: every spare that asked may take its device step
        while self.spares and (self.spares[0].device != device or not self.spares[0].process.is_alive()):
            self.spares.pop(0).kill()
        process = self.spares.pop(0) if self.spares else self._start(device)
        try:
            process.wait_ready()
        except BadFork:
            self._forks_cannot_use_cuda()
            process = self._start(device)
            process.wait_ready()
        self.retired.append(process)
        return process, time.perf_counter() - started

    def reap(self) -> None:
        """Collect candidate processes that have finished (each exits by itself after its result)."""
        for process in list(self.retired):
            if not process.process.is_alive():
                process.process.join(0)
                process.conn.close()
                self.retired.remove(process)
            elif process.finished is not None and time.perf_counter() - process.finished > RETIRED_GRACE_S:
                process.kill()
                self.retired.remove(process)

    def grant_spares(self) -> None:
        """Let every spare that has finished its CPU step take its device step (kb_process's module
        doc). Called only where nothing is timed: between jobs, and while a job loads and is checked."""
        for process in list(self.spares):
            outcome = self._advance(process, process.grant)
            if outcome == "bad_fork":
                return
            if outcome == "ok" and process.preloaded is False:
                self._say_not_preloaded()

    def settle_spares(self) -> None:
        """Before every timed loop: wait until no spare is in its device step. A process creating its
        CUDA context slows calls timed meanwhile on the same GPU (on the H200, about one in five by
        0.3-1.5 ms); spares still in their CPU step are left alone, as they take their device step only
        when granted, and no grant is given until the timed job's result is in. A spare that does not
        finish its device step in SPARE_START_TIMEOUT_S is dropped."""
        for process in list(self.spares):
            if process.state != "granted":
                continue
            if not process.conn.poll(SPARE_START_TIMEOUT_S):
                # A spare that hangs while starting is dropped, not waited for: the loop it would stall
                # is a candidate's, whose timeout it must not become.
                self._drop(process)
            elif self._advance(process, process.wait_ready) == "bad_fork":
                return

    def _advance(self, process: CandidateProcess, step: Callable[[], object]) -> str:
        """One start-up step of a spare: "ok"; "dropped" (it failed to start: gone from the pool);
        "bad_fork" (forked processes cannot use CUDA: every spare is gone, spawned from now on)."""
        try:
            step()
        except BadFork:
            self._forks_cannot_use_cuda()
            return "bad_fork"
        except (ChildDied, RuntimeError):
            self._drop(process)
            return "dropped"
        return "ok"

    def _say_not_preloaded(self) -> None:
        """Once: a forked candidate process found nothing preloaded (kb_process.process_context)."""
        if self.start_method == "forkserver" and not self.warned_preload:
            self.warned_preload = True
            print(
                "krefine harness: candidate processes import torch themselves (the forkserver did not "
                "preload the harness); each starts seconds slower",
                file=sys.stderr,
            )

    def _drop(self, process: CandidateProcess) -> None:
        self.spares.remove(process)
        process.kill()

    def _forks_cannot_use_cuda(self) -> None:
        print("krefine harness: forked candidate processes cannot use CUDA; spawning them", file=sys.stderr)
        self.start_method = "spawn"
        _kill_all(self.spares)

    def warm_spares(self, device: str) -> None:
        if not self.isolate:
            return
        wanted = SPARES["cuda" if device.startswith("cuda") else "cpu"]
        while len(self.spares) < wanted:
            self.spares.append(self._start(device))
        self.grant_spares()

    def _start(self, device: str) -> CandidateProcess:
        self.processes_started += 1
        return CandidateProcess(device, self.start_method)

    def close(self) -> None:
        _kill_all(self.spares)
        _kill_all(self.retired)


def _kill_all(processes: list[CandidateProcess]) -> None:
    while processes:
        processes.pop().kill()


def _run_in_process_or_here(worker: Worker, job: dict[str, Any], ctx: ProblemContext) -> tuple[Verdict, float]:
    """`job`'s verdict from a fresh candidate process (or from this one, for unit tests), and how long
    it waited for a warm process."""
    if not worker.isolate:
        pinned = kb_candidate.settings_snapshot()
        runs = {"retime": kb_candidate.retime_candidate, "reference": kb_candidate.time_reference_job}
        run = runs.get(job["kind"], kb_candidate.evaluate_candidate)
        return run(job, ctx, worker.flusher, pinned), 0.0
    process, waited = worker.take_process(job["device"])
    if job["device"].startswith("cuda"):
        # The replacement starts its CPU step now; its device step is granted while this job loads and
        # is checked, or after its result, never while it is timed (settle_spares, grant_spares).
        worker.warm_spares(job["device"])
    try:
        wire = process.run(job, ctx, between=worker.grant_spares, before_timing=worker.settle_spares)
        worker.grant_spares()
        try:
            return kb_candidate.verdict_from_wire(wire), waited
        except (KeyError, TypeError, ValueError) as exc:
            raise kb_wire.ForbiddenMessage(f"a result that is not a verdict ({exc})") from None
    except kb_wire.ForbiddenMessage as exc:
        return forbidden_message_verdict(exc), waited
    except ChildDied as died:
        if job["kind"] == "reference":
            # The reference's own timing process (trusted code, no candidate in it): its death is not a
            # candidate's to report, so the worker lives on and times the reference itself.
            failed = Verdict(status="runtime_error", compiled=True, correctness=False)
            failed.feedback.append(f"the reference's timing process ended without a result ({died})")
            return failed, waited
        print(f"krefine harness: {died}; ending the worker the same way", file=sys.stderr)
        worker.close()
        worker.on_child_death(died)
        raise


def forbidden_message_verdict(exc: kb_wire.ForbiddenMessage) -> Verdict:
    """The candidate's process wrote something to the worker's pipe that the harness never sends (a
    crafted pickle, a forged result): nothing of it ran here (kb_wire), the process is gone, and the
    candidate fails, in either mode (KernelBench's harness has no such pipe to abuse)."""
    message = f"the candidate's process sent the worker a message the harness never sends: {exc}"
    verdict = Verdict(status="runtime_error", compiled=True, correctness=False)
    verdict.metadata["runtime_error"] = message
    verdict.metadata["runtime_error_name"] = "forbidden_message"
    verdict.findings.append({"category": "forbidden_message", "severity": "error", "message": message})
    verdict.feedback.append(
        f"Integrity check failed: {message}. Candidates must not touch the harness's pipe to the worker."
    )
    return verdict


def _hold_to_compared_trials(verdict: Verdict, passed: int, trials: int) -> None:
    """Strict mode: the worker compared the correctness trials itself; a result from the candidate's
    process that claims correct with fewer trials passed here is forged (the process wrote its own)."""
    if passed == trials:
        return
    message = f"the candidate's process reported it correct, but {passed} of {trials} trials passed the worker's comparison"
    kb_strict.refuse_forged(verdict, message)


def _hold_to_timed_checks(verdict: Verdict, session: kb_strict.StrictSession, timing: dict[str, Any]) -> None:
    """Strict mode: a timed result stands only if the worker served every timed call it reports and none
    of its checks failed. A result with times for calls that never asked for inputs, or correct after a
    failed check, was written by something other than the harness's loop (a replaced timer, a patched
    check): refused as forged."""
    timed = int(verdict.runtime_stats.get("num_trials", 0)) + int(timing["discard_first"])
    if session.problems == 0 and session.calls >= timed:
        return
    if session.problems:
        message = f"the candidate's process reported it correct and timed, but {session.problems} of the worker's checks of its timed calls failed"
    else:
        message = f"the candidate's process reported {timed} timed calls, but the worker handed out inputs for {session.calls}"
    kb_strict.refuse_forged(verdict, message)


def run_candidate(
    worker: Worker, job: dict[str, Any], ctx: ProblemContext, key: int | None = None, every: bool | None = None
) -> Verdict:
    """Run a job in a fresh candidate process (or, for unit tests, here), with the reference served
    from `ctx`. Time the worker spends on the reference meanwhile is booked as reference time. `key`
    fixes the strict inputs (the reference's cached timing), `every` checks every timed call."""
    reference_before, timing_before = ctx.build_seconds, ctx.timing_build_seconds
    started = time.perf_counter()
    # Strict timing's secrets and checks live here, in the worker, for this one run (kb_strict); in
    # faithful mode they serve the fresh-input probe after KernelBench's loop, every output checked.
    if every is None:
        every = job["kind"] == "retime" or ctx.mode != "strict"
    session = ctx.strict_session = kb_strict.StrictSession(
        ctx, every=every, key=key, tolerance=tolerance(ctx.precision, job.get("tolerance"))
    )
    try:
        verdict, waited = _run_in_process_or_here(worker, job, ctx)
        # What the worker records about strict timing is its own: whatever the process wrote there goes.
        verdict.metadata.pop("worker_clock", None)
        verdict.metadata.pop("strict_timing", None)
        if ctx.mode == "strict" and job["kind"] == "evaluate" and verdict.status == "correct":
            _hold_to_compared_trials(verdict, session.trials_passed, job["trials"])
        if ctx.mode == "strict" and verdict.status == "correct" and verdict.runtime_stats:
            _hold_to_timed_checks(verdict, session, job["timing"])
        if ctx.mode == "strict" and verdict.status == "correct" and verdict.runtime_stats:
            observed = session.observed_timed_ms(int(job["timing"]["discard_first"]))
            verdict.metadata["worker_clock"] = {
                "observed_mean_ms": statistics.fmean(observed) if observed else None,
                "observed_trimmed_ms": kb_strict.trimmed_mean(observed) if observed else None,
                "observed_calls": len(observed),
                "reported_mean_ms": float(verdict.runtime_stats["mean"]),
            }
            verdict.metadata["strict_timing"] = kb_strict.strict_regime(ctx, job["timing"])
    finally:
        if ctx.strict_session is not None:
            ctx.strict_session.close()
        ctx.strict_session = None
    total = time.perf_counter() - started
    # Reference data built while the candidate waited for it: trials during its check, the timing
    # inputs during its timing. Booked as reference time, taken out of the phase it waited in.
    reference_in_loop = ctx.build_seconds - reference_before
    for_timing = min(reference_in_loop, ctx.timing_build_seconds - timing_before)
    verdict.phases["reference_s"] += reference_in_loop
    verdict.phases["correctness_s"] = max(0.0, verdict.phases["correctness_s"] - (reference_in_loop - for_timing))
    verdict.phases["timing_s"] = max(0.0, verdict.phases["timing_s"] - for_timing)
    measured = sum(verdict.phases[k] for k in ("load_s", "correctness_s", "timing_s", "reference_s"))
    # What isolation costs this candidate: waiting for a warm process, handing it the job and the
    # reference data, and its exit.
    verdict.phases["isolation_s"] = max(0.0, total - waited - measured) if worker.isolate else 0.0
    verdict.phases["spawn_wait_s"] = verdict.phases.get("spawn_wait_s", 0.0) + waited
    return verdict

def profile_isolated(request: dict[str, Any], worker: Worker, scratch: str) -> dict[str, Any]:
    """`op: profile` in a fresh candidate process (the profile imports and runs the candidate)."""
    if not worker.isolate:
        return kb_profile.profile(request, worker.references, scratch)
    process, _ = worker.take_process(request["device"])
    # ncu is started from here, not from the confined candidate process: its injection needs, while
    # CUDA initialises in the profiled process, writes the confinement refuses; that process confines
    # itself once CUDA is up (kb_profile.ncu_target).
    job = {
        "kind": "profile",
        "request": {**request, "ncu_from_worker": True},
        "build_dir": request["candidate"]["build_dir"],
        "settings": kb_candidate.settings_snapshot(),
    }
    try:
        # A profile asks for no reference data.
        result: dict[str, Any] = process.run(job, None)  # type: ignore[arg-type]
    except ChildDied as died:
        worker.close()
        worker.on_child_death(died)
        raise
    finally:
        worker.warm_spares(request["device"])
    if result.get("status") == "ok" and kb_profile.profiler_of(request) != "torch":
        started = time.perf_counter()
        kb_profile.add_ncu(result, request, select_device(request), scratch)
        result["duration_s"] = round(result.get("duration_s", 0.0) + time.perf_counter() - started, 6)
    return result
