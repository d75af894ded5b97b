"""One candidate, one clean process: the candidate side of `op: evaluate`.

Every candidate is imported, constructed, checked and timed in a fresh single-use process that the
persistent worker starts ahead of need (kb_process: spawned, torch imported, the device context up,
thread pools started, this module and kb_timing imported so the timer and the check are captured).
The worker keeps what is expensive and trusted (the reference model, its cached inputs, outputs and RNG
states, the reference timing) and serves them on request (`serve_reference`); tensors cross by
torch.multiprocessing (CUDA IPC on the GPU, shared memory on the CPU), so nothing is regenerated and a
candidate that writes into its inputs writes into the worker's cache, where the worker's own checksum
sees it. When the process exits, nothing it did (patched functions, torch/cuDNN flags, threads, streams,
imported modules, a `fast_matmul` extension of the same name as the next candidate's) survives.

`Integrity` holds the runtime checks: the settings the reference depends on are set by krefine before
the candidate is imported and compared after every phase; Python threads left running after a forward,
new native threads, functions the timer or the check depend on replaced, and outputs that are not plain
dense tensors are findings: warnings in faithful mode, errors (the candidate fails) in strict mode.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

import kb_compile
import kb_correctness
import kb_feedback
import kb_native
import kb_reference
import kb_strict
import kb_tensors
import kb_timing
import kb_wire
from kb_correctness import LoopOutcome, ReferenceSource, Verdict
from kb_feedback import CANDIDATE_ERRORS, get_error_name
from kb_reference import ReferenceFailure, TrialData
from kb_strict import dense_output_problem
from kb_tensors import RngState

# The reference's strict timing derives its inputs from the problem's seed plus this offset (its time is
# cached per problem); candidates' timed calls use secret seeds (kb_strict).
STRICT_REFERENCE_KEY_OFFSET = 1_000_003
_enumerate_threads = threading.enumerate
_perf_counter = time.perf_counter


# ------------------------------------------------------------------------------------------ settings


def settings_snapshot() -> dict[str, Any]:
    """The process-wide settings a reference's numbers depend on."""
    return {
        "tf32_matmul": bool(torch.backends.cuda.matmul.allow_tf32),
        "tf32_cudnn": bool(torch.backends.cudnn.allow_tf32),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
        "cudnn_deterministic": bool(torch.backends.cudnn.deterministic),
        "deterministic_algorithms": bool(torch.are_deterministic_algorithms_enabled()),
        "num_threads": int(torch.get_num_threads()),
        "default_dtype": str(torch.get_default_dtype()),
    }


def apply_settings(settings: dict[str, Any]) -> None:
    """Set what `settings_snapshot` reads (the matmul precision first: it also sets allow_tf32)."""
    torch.set_float32_matmul_precision(settings["float32_matmul_precision"])
    torch.backends.cuda.matmul.allow_tf32 = settings["tf32_matmul"]
    torch.backends.cudnn.allow_tf32 = settings["tf32_cudnn"]
    torch.backends.cudnn.benchmark = settings["cudnn_benchmark"]
    torch.backends.cudnn.deterministic = settings["cudnn_deterministic"]
    if torch.are_deterministic_algorithms_enabled() != settings["deterministic_algorithms"]:
        torch.use_deterministic_algorithms(settings["deterministic_algorithms"])  # seconds: imports
    if torch.get_num_threads() != settings["num_threads"]:
        torch.set_num_threads(settings["num_threads"])
    torch.set_default_dtype(getattr(torch, settings["default_dtype"].removeprefix("torch.")))


def native_threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 0


class Integrity:
    """Runtime checks on one candidate in its own process; collects `Finding`s on the verdict."""

    def __init__(self, mode: str, device: torch.device, pinned: dict[str, Any]) -> None:
        self.strict = mode == "strict"
        self.device = device
        self.pinned = pinned
        self.threads = {t.ident for t in _enumerate_threads()}
        self.native = native_threads()
        self._seen: set[str] = set()

    def report(self, verdict: Verdict, category: str, message: str, fatal: bool = True) -> bool:
        """Record a finding. Returns False when it fails the candidate (strict mode, `fatal`)."""
        error = self.strict and fatal
        if category not in self._seen:  # the first occurrence says when; one finding per category
            self._seen.add(category)
            severity = "error" if error else "warning"
            verdict.findings.append({"category": category, "severity": severity, "message": message})
            if error:
                verdict.feedback.append(f"Integrity check failed (strict mode): {message}")
            elif fatal:
                verdict.feedback.append(f"Warning (integrity): {message}")
        if error:
            verdict.status, verdict.correctness = "incorrect", False
            verdict.metadata.setdefault("integrity_issue", message)
            verdict.metadata.setdefault("integrity_issue_name", category)
        return not error

    def check_process(self, verdict: Verdict, phase: str) -> bool:
        """Settings, patched functions and threads, after `phase` (import, construction, ...)."""
        ok = True
        now = settings_snapshot()
        changed = [f"{k} from {self.pinned[k]!r} to {now[k]!r}" for k in self.pinned if now.get(k) != self.pinned[k]]
        if changed:
            ok &= self.report(
                verdict, "settings_changed", f"the candidate changed {', '.join(changed)} ({phase})"
            )
        patched = kb_timing.patched_functions()
        if patched:
            ok &= self.report(
                verdict,
                "timing_patch",
                f"the candidate replaced {', '.join(patched)} ({phase}); krefine's timer and check use "
                "the originals",
            )
        ok &= self.check_threads(verdict, phase)
        return ok

    def check_threads(self, verdict: Verdict, phase: str) -> bool:
        ok = True
        alive = [t for t in _enumerate_threads() if t.ident not in self.threads and t.is_alive()]
        if alive:
            names = ", ".join(sorted(t.name for t in alive))
            ok = self.report(
                verdict,
                "thread_left_running",
                f"Python thread(s) {names} still running {phase}: work must be finished when forward "
                "returns",
            )
        native = native_threads()
        if native > self.native:
            # Informational: native pools (OpenMP, CUDA libraries) may legitimately start threads.
            self.report(
                verdict,
                "native_threads",
                f"{native - self.native} native thread(s) more than before the candidate ({phase})",
                fatal=False,
            )
            self.native = native
        return ok

    def after_forward(self, verdict: Verdict, output: Any, label: str) -> bool:
        problem = dense_output_problem(output, self.device)
        ok = True
        if problem is not None:
            ok = self.report(verdict, "non_dense_output", f"the output {label} is {problem}")
        return self.check_threads(verdict, f"after the forward {label}") and ok


# --------------------------------------------------------------------------------- the candidate side


def evaluate_candidate(
    job: dict[str, Any], ref: ReferenceSource, flusher: kb_timing.L2Flusher, pinned: dict[str, Any]
) -> Verdict:
    """Load, construct, check and time one candidate against `ref`. The worker adds the reference's
    timing, the speedup and the reference's own failures."""
    device, hardware = ref.device, job["hardware"]
    verdict = Verdict(metadata={"hardware": hardware, "device": str(device)})
    integrity = Integrity(ref.mode, device, pinned)
    build_dir = job["build_dir"]
    started = _perf_counter()
    loaded = kb_compile.load_candidate(job["source"], build_dir, os.path.join(build_dir, "load.log"))
    try:
        if not loaded.ok:
            verdict.phases["load_s"] = _perf_counter() - started
            kb_correctness.compile_failed(verdict, loaded)
            return verdict
        ok = integrity.check_process(verdict, "at import")
        model_new = construct_or_fail(verdict, ref, loaded, hardware)
        verdict.phases["load_s"] = _perf_counter() - started
        if model_new is None:
            return verdict
        ok = integrity.check_process(verdict, "in ModelNew's constructor") and ok
        if not ok:
            return verdict
        check_and_time(verdict, job, ref, model_new, loaded.candidate_path, integrity, flusher)
    finally:
        verdict.env["pinned"] = pinned
    return verdict


def retime_candidate(
    job: dict[str, Any], ref: ReferenceSource, flusher: kb_timing.L2Flusher, pinned: dict[str, Any]
) -> Verdict:
    """Re-verification of an excessive speedup (strict): only construct and time, on fresh inputs from
    new secrets (kb_strict), every output checked by the worker."""
    device, hardware = ref.device, job["hardware"]
    verdict = Verdict(metadata={"hardware": hardware, "device": str(device)})
    integrity = Integrity(ref.mode, device, pinned)
    loaded = kb_compile.load_candidate(job["source"], job["build_dir"], os.path.join(job["build_dir"], "load.log"))
    if not loaded.ok:
        kb_correctness.compile_failed(verdict, loaded)
        return verdict
    model_new = construct_or_fail(verdict, ref, loaded, hardware)
    if model_new is None or not integrity.check_process(verdict, "at import"):
        return verdict
    verdict.status, verdict.correctness = "correct", True
    time_candidate(verdict, job, ref, model_new, loaded.candidate_path, integrity, flusher)
    return verdict


def construct_or_fail(
    verdict: Verdict, ref: ReferenceSource, loaded: kb_compile.LoadResult, hardware: str
) -> torch.nn.Module | None:
    assert loaded.model_new is not None
    try:
        return construct_candidate(ref, loaded.model_new)
    except RuntimeError as exc:
        # KernelBench catches only RuntimeError here: compiled=True, correctness=False.
        verdict.metadata["runtime_error"] = str(exc)
        verdict.metadata["runtime_error_name"] = get_error_name(exc)
        kb_correctness.fail_candidate_exception(
            verdict, exc, ref.device, loaded.candidate_path, "while constructing ModelNew"
        )
        return None
    except CANDIDATE_ERRORS as exc:
        # Anything else escapes KernelBench's eval; its batch script records compiled=False.
        verdict.compiled = False
        poisoned = kb_correctness.sticky_error(exc, ref.device)
        if poisoned is not None:
            verdict.metadata = kb_correctness.kernelbench_cuda_error_metadata(poisoned, hardware, ref.device)
            verdict.status, verdict.sticky, verdict.sticky_cause = "cuda_error", True, poisoned
        else:
            verdict.metadata = kb_correctness.other_error_metadata(exc, hardware, ref.device)
            verdict.status = "runtime_error"
        verdict.feedback.append(
            "ModelNew(*get_init_inputs()) failed: ModelNew's constructor must accept the same arguments "
            f"as Model's.\n{kb_feedback.candidate_traceback(exc, loaded.candidate_path)}"
        )
        return None


def construct_candidate(ref: ReferenceSource, model_new_cls: type) -> torch.nn.Module:
    """KernelBench: under no_grad, set_seed(seed) -> ModelNew(*init_inputs) -> assert forward ->
    .to(device, dtype) -> sync. Weights match the reference only by RNG replay."""
    init_inputs = ref.init_inputs()
    with torch.no_grad():
        kb_reference.set_seed(ref.seed)
        model: torch.nn.Module = model_new_cls(*init_inputs)
        if not hasattr(model, "forward"):
            raise AssertionError()
        model = model.to(device=ref.device, dtype=ref.dtype)
        kb_tensors.synchronize(ref.device)
    return model


def check_and_time(
    verdict: Verdict,
    job: dict[str, Any],
    ref: ReferenceSource,
    model_new: torch.nn.Module,
    candidate_path: str,
    integrity: Integrity,
    flusher: kb_timing.L2Flusher,
) -> None:
    trials = job["trials"]
    started = _perf_counter()
    try:
        outcome = kb_correctness.run_trials(ref, model_new, trials, verdict, candidate_path, integrity)
    except ReferenceFailure as failure:
        verdict.phases["correctness_s"] = _perf_counter() - started
        verdict.reference_failure = (trials, failure.index)
        return
    except CANDIDATE_ERRORS as exc:
        # Outside the per-trial try (e.g. ModelNew.to failing): KernelBench's outer catch.
        verdict.metadata["runtime_error"] = str(exc)
        verdict.metadata["runtime_error_name"] = get_error_name(exc)
        kb_correctness.fail_candidate_exception(
            verdict, exc, ref.device, candidate_path, "during the correctness check"
        )
        outcome = LoopOutcome(0, stop=True, poisoned=verdict.sticky)
    verdict.phases["correctness_s"] = _perf_counter() - started
    if outcome.poisoned:
        kb_correctness.kernelbench_sticky_result(verdict, job["hardware"], ref.device)
        return
    if outcome.stop:
        verdict.correctness = False
        return
    verdict.correctness = outcome.passed == trials
    verdict.feedback.append(kb_feedback.correctness_summary(outcome.passed, trials, ref.precision, ref.atol, ref.rtol))
    if not verdict.correctness:
        verdict.status = "incorrect"
        return
    verdict.status = "correct"
    if not integrity.check_process(verdict, "after the correctness trials"):
        return
    if job["timing"]["measure"]:
        time_candidate(verdict, job, ref, model_new, candidate_path, integrity, flusher)


def time_candidate(
    verdict: Verdict,
    job: dict[str, Any],
    ref: ReferenceSource,
    model_new: torch.nn.Module,
    candidate_path: str,
    integrity: Integrity,
    flusher: kb_timing.L2Flusher,
) -> None:
    timing = job["timing"]
    started = _perf_counter()
    try:
        model_new = model_new.to(device=ref.device, dtype=ref.dtype)
        kb_tensors.synchronize(ref.device)
        if ref.mode == "strict":
            times = strict_times(model_new, ref, timing, flusher)
        else:
            times = kb_timing.time_callable(model_new, ref.timing_inputs(), ref.device, timing, flusher)
            fresh_probe(verdict, model_new, ref, integrity, times)
            if ref.device.type == "cuda":
                stream_escape(verdict, model_new, ref, integrity)
        verdict.runtime_stats = kb_timing.runtime_stats(times)
    except kb_timing.TimedOutputMismatch as mismatch:
        verdict.phases["timing_s"] = _perf_counter() - started
        verdict.status, verdict.correctness = "incorrect", False
        verdict.metadata["correctness_issue"] = f"Output mismatch in timed call {mismatch.call}"
        verdict.metadata["correctness_issue_name"] = "timed_output_mismatch"
        verdict.feedback.append(
            f"Strict timing checks the outputs of timed calls, each on fresh inputs: in timed call "
            f"{mismatch.call} {mismatch.problem}. The output must be computed from the inputs on every "
            "call (no caching across calls, no work left running after forward returns)."
        )
        return
    except kb_native.NativeTimerUnavailable as exc:
        # The worker refuses strict evaluations without the loop, so this is a failed load here (or a
        # candidate that unloaded it): no time, never the Python loop instead.
        verdict.phases["timing_s"] = _perf_counter() - started
        integrity.report(verdict, "native_timer_unavailable", f"strict timing could not run: {exc}")
        verdict.runtime_stats = {}
        return
    except kb_timing.TimingHooked as hooked:
        verdict.phases["timing_s"] = _perf_counter() - started
        integrity.report(
            verdict,
            "timing_hook",
            f"{hooked.message}: strict timing runs no code but forward inside its loop (trace, profile, "
            "monitoring and gc hooks are refused)",
        )
        return
    except CANDIDATE_ERRORS as exc:
        verdict.phases["timing_s"] = _perf_counter() - started
        verdict.metadata["error_during_performance"] = str(exc)
        if kb_correctness.fail_candidate_exception(verdict, exc, ref.device, candidate_path, "while timing"):
            kb_correctness.kernelbench_sticky_result(verdict, job["hardware"], ref.device)
        else:
            verdict.status = "correct"  # KernelBench keeps correctness; only the runtime stays -1
        return
    verdict.phases["timing_s"] = _perf_counter() - started
    if not integrity.check_process(verdict, "after timing"):
        verdict.runtime_stats = {}


def strict_times(
    model: Any, ref: ReferenceSource, timing: dict[str, Any], flusher: kb_timing.L2Flusher
) -> list[float]:
    """Strict mode's timed calls of `model`, candidate or reference alike: the native loop
    (kb_timing.time_strict) in this single-use process, each call's fresh inputs from the worker and
    its output handed back to the worker's check (`ref.strict_check`). The reference's strict time is
    taken by this same function in a process of its own (`time_reference_job`), so that for identical
    code the speedup is 1 up to noise: same loop, inputs, hand-overs, fences, L2 flush, warm-ups, calls
    and discarded calls, and the same worker serving them."""

    def check(call: int, output: Any, calls: int) -> str | None:
        # Only a plain tensor crosses to the worker (a subclass would run its own code there).
        problem = dense_output_problem(output, ref.device)
        if problem is not None:
            return f"the output is {problem}"
        return ref.strict_check(call, output, calls)

    return kb_timing.time_strict(model, ref.strict_warmup, ref.strict_inputs, ref.device, timing, flusher, check)


def time_reference_job(
    job: dict[str, Any], ref: ReferenceSource, flusher: kb_timing.L2Flusher, pinned: dict[str, Any]
) -> Verdict:
    """Strict mode's reference timing (job kind "reference"), in a single-use process like a candidate's:
    the problem's Model built as the worker builds it (set_seed, init inputs, .to), compiled when
    `eval.reference = "compile"`, and timed by `strict_times`, served by the worker exactly as a
    candidate is. `correct` with runtime stats, or `runtime_error` with the reason."""
    verdict = Verdict(metadata={"hardware": job["hardware"], "device": str(ref.device)})
    timing = job["timing"]
    started = _perf_counter()
    try:
        problem = kb_reference.load_problem(job["reference_code"])
        model = construct_candidate(ref, problem.model)
        spec = timing.get("reference_compile")
        if spec:
            # Inductor's and Triton's caches must be writable under this process's confinement.
            os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(job["build_dir"], "inductor"))
            os.environ.setdefault("TRITON_CACHE_DIR", os.path.join(job["build_dir"], "triton"))
        model = kb_reference.compiled_reference(model, spec)
        times = strict_times(model, ref, timing, flusher)
    except kb_timing.TimedOutputMismatch as mismatch:
        verdict.status, verdict.correctness = "incorrect", False
        verdict.feedback.append(f"the reference's own output in timed call {mismatch.call}: {mismatch.problem}")
        return verdict
    except (kb_native.NativeTimerUnavailable, kb_timing.TimingHooked) as exc:
        verdict.status, verdict.correctness = "runtime_error", False
        verdict.feedback.append(str(exc))
        return verdict
    except CANDIDATE_ERRORS as exc:
        verdict.status, verdict.correctness = "runtime_error", False
        verdict.feedback.append(kb_feedback.exception_line(exc))
        return verdict
    finally:
        verdict.phases["timing_s"] = _perf_counter() - started
        verdict.env["pinned"] = pinned
    verdict.status, verdict.correctness = "correct", True
    verdict.runtime_stats = kb_timing.runtime_stats(times)
    return verdict


def fresh_probe(
    verdict: Verdict, model_new: torch.nn.Module, ref: ReferenceSource, integrity: Integrity, times: list[float]
) -> None:
    """Faithful mode credits what KernelBench's loop measures on one input set. After it, a few calls on
    inputs no call has seen (the worker's, as in strict mode), each output checked by the worker: an
    output that does not match (a stolen, memoised, zeroed or unfinished one), or, on the GPU, fresh
    calls much slower than the timed ones (kb_timing.faster_than_fresh: a memo or skipped work), is a
    warning. The verdict and the timing stay KernelBench's."""
    fresh: list[float] = []
    calls = kb_timing.PROBE_CALLS
    try:
        for call in range(calls):
            args = ref.strict_inputs(call)
            output, ms = kb_timing.time_one(model_new, args, ref.device)
            fresh.append(ms)
            plain = dense_output_problem(output, ref.device)
            problem = f"the output is {plain}" if plain is not None else ref.strict_check(call, output, calls)
            del output, args
            if problem is not None:
                integrity.report(
                    verdict,
                    "fresh_output_mismatch",
                    f"after timing, on inputs no call had seen, {problem}: the timed calls may have returned "
                    "a stolen, memoised or unfinished output",
                )
                return
    except CANDIDATE_ERRORS as exc:
        integrity.report(
            verdict,
            "fresh_output_mismatch",
            f"after timing, a call on inputs no call had seen raised {kb_feedback.exception_line(exc)}",
        )
        return
    if ref.device.type == "cuda" and times and fresh:
        median = float(sorted(times)[len(times) // 2])
        if kb_timing.faster_than_fresh(median, min(fresh)):
            integrity.report(
                verdict,
                "memo_suspected",
                f"calls on inputs no call had seen took at least {min(fresh):.3f} ms, the timed calls "
                f"{median:.3f} ms (median): the timed calls may hit a memo or skip work",
            )


def stream_escape(verdict: Verdict, model_new: torch.nn.Module, ref: ReferenceSource, integrity: Integrity) -> None:
    """Faithful mode credits what KernelBench's events measure; work the candidate put on another stream
    escapes them. A warning (never a verdict change) when a device-wide synchronize waits much longer
    than the events saw (kb_timing.escaped). Strict mode's fence already times such work."""
    event_ms, host_ms = kb_timing.stream_escape_probe(model_new, ref.timing_inputs(), ref.device)
    if kb_timing.escaped(event_ms, host_ms):
        integrity.report(
            verdict,
            "stream_escape",
            f"a call took {host_ms:.3f} ms to a device-wide synchronize but {event_ms:.3f} ms on the "
            "timed stream's events: work on another stream escapes the measurement, so the speedup is "
            "overstated",
            fatal=True,
        )


# ---------------------------------------------------------------------------- reference over a pipe


class RemoteReferenceFailure(ReferenceFailure):
    """The worker's cached reference forward failed for a trial; the worker fills in the details."""

    def __init__(self, index: int) -> None:
        Exception.__init__(self, f"reference failed in trial {index + 1}")
        self.captured = None  # type: ignore[assignment]
        self.index = index


class RemoteReference:
    """The candidate process's view of the worker's ProblemContext (kb_correctness.ReferenceSource)."""

    def __init__(self, conn: Any, job: dict[str, Any]) -> None:
        self.conn = conn
        self.device = kb_tensors.normalize_device(job["device"])
        self.precision = job["precision"]
        self.dtype = kb_reference.DTYPES[self.precision]
        self.mode = job["mode"]
        self.seed = job["seed"]
        self.atol, self.rtol = kb_reference.tolerance(self.precision, job.get("tolerance"))

    def _ask(self, *message: Any) -> Any:
        self.conn.send(message)
        status, value = self.conn.recv()
        if status == "reference_failed":
            raise RemoteReferenceFailure(value)
        if status == "error":
            raise RuntimeError(value)
        return value

    def trial_seeds(self, trials: int) -> list[int]:
        return kb_reference.trial_seeds(self.seed, trials)

    def trial(self, trials: int, index: int, seed: int) -> TrialData:
        inputs, output, cpu, cuda = self._ask("trial", trials, index, seed)
        return TrialData(list(inputs), output, RngState(cpu, cuda))

    def verify_trial(self, trials: int, index: int) -> bool:
        return bool(self._ask("verify", trials, index))

    def init_inputs(self) -> list[Any]:
        return list(self._ask("init_inputs"))

    def timing_inputs(self) -> list[Any]:
        return list(self._ask("timing_inputs"))

    def strict_warmup(self) -> list[Any]:
        return list(self._ask("strict_warmup"))

    def strict_inputs(self, call: int) -> list[Any]:
        return list(self._ask("strict_inputs", call))

    def strict_check(self, call: int, output: Any, calls: int) -> str | None:
        problem: str | None = self._ask("strict_check", call, kb_strict.to_wire(output), calls)
        return problem

    def strict_trial(self, trials: int, index: int, seed: int) -> TrialData:
        inputs, shapes, cpu, cuda = self._ask("strict_trial", trials, index, seed)
        return TrialData(list(inputs), shapes, RngState(cpu, cuda))

    def strict_compare(self, index: int, output: Any) -> kb_correctness.TrialComparison:
        result: kb_correctness.TrialComparison = self._ask("strict_compare", index, kb_strict.to_wire(output))
        return result


# The requests a candidate process makes right before a timed loop (faithful timing, strict timing).
TIMING_REQUESTS = ("timing_inputs", "strict_warmup")


def serve_reference(
    conn: Any,
    ctx: kb_reference.ProblemContext,
    before_timing: Callable[[], None] | None = None,
    between: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """In the worker: answer the candidate process's requests for reference data until it sends its
    result. Raises EOFError when the process died, kb_wire.ForbiddenMessage when it wrote anything
    but a harness message (messages are read with kb_wire's unpickler, never `conn.recv`).
    `before_timing` (the worker's Worker.settle_spares) runs before answering a request that starts a
    timed loop, so nothing of the worker's is still starting on the device while the loop runs;
    `between` (Worker.grant_spares) before answering any request until then. After the first timed
    loop starts, everything up to the result (more timed loops, faithful mode's probes, which compare
    times too) counts as timed."""
    timing = False
    while True:
        message = kb_wire.recv(conn)
        if type(message) is not tuple or not message or type(message[0]) is not str:
            raise kb_wire.ForbiddenMessage(f"a {type(message).__name__} instead of a request")
        op = message[0]
        timing = timing or op in TIMING_REQUESTS
        if before_timing is not None and op in TIMING_REQUESTS:
            before_timing()
        elif between is not None and not timing:
            between()
        if op == "result":
            if len(message) != 2 or type(message[1]) is not dict:
                raise kb_wire.ForbiddenMessage("a result that is not a verdict")
            result: dict[str, Any] = message[1]
            return result
        reply = _serve_one(ctx, op, message)
        if reply is _OUT_OF_MEMORY:
            # krefine's own caches (other problems' reference data on the device) give way before a
            # reference runs out of memory: the request is answered once more without them.
            ctx.cache.evict_others(ctx)
            reply = _serve_one(ctx, op, message, retry=False)
        conn.send(reply)


# The marker _serve_one returns for a reference that ran out of memory on the device (retry=True).
_OUT_OF_MEMORY: tuple[str, Any] = ("out_of_memory", None)


def _serve_one(
    ctx: kb_reference.ProblemContext, op: str, message: tuple[Any, ...], retry: bool = True
) -> tuple[str, Any]:
    """One request of serve_reference, answered. With `retry`, a CUDA out-of-memory error returns
    _OUT_OF_MEMORY (outside the except clause, so the failed attempt's tensors are freed first)."""
    try:
        return _dispatch(ctx, op, message)
    except ReferenceFailure:
        return ("reference_failed", message[2])
    except CANDIDATE_ERRORS as exc:
        if retry and ctx.device.type == "cuda" and kb_correctness.is_out_of_memory(exc):
            return _OUT_OF_MEMORY
        return ("error", f"the reference failed while serving {op}: {type(exc).__name__}: {exc}")


def _dispatch(ctx: kb_reference.ProblemContext, op: str, message: tuple[Any, ...]) -> tuple[str, Any]:
    if op == "trial":
        _, trials, index, seed = message
        data = ctx.trial(trials, index, seed)
        return ("ok", (data.inputs, data.output, data.rng.cpu, data.rng.cuda))
    if op == "strict_trial":
        _, trials, index, seed = message
        data = ctx.strict_trial(trials, index, seed)
        return ("ok", (data.inputs, data.output, data.rng.cpu, data.rng.cuda))
    if op == "strict_compare":
        return ("ok", ctx.strict_compare(message[1], kb_strict.from_wire(message[2])))
    if op == "verify":
        return ("ok", ctx.verify_trial(message[1], message[2]))
    if op == "init_inputs":
        return ("ok", ctx.init_inputs())
    if op == "timing_inputs":
        return ("ok", ctx.timing_inputs())
    if op == "strict_warmup":
        return ("ok", ctx.strict_warmup())
    if op == "strict_inputs":
        return ("ok", ctx.strict_inputs(message[1]))
    if op == "strict_check":
        return ("ok", ctx.strict_check(message[1], kb_strict.from_wire(message[2]), message[3]))
    return ("error", f"unknown request {op!r}")


def verdict_to_wire(verdict: Verdict) -> dict[str, Any]:
    return {
        "status": verdict.status,
        "compiled": verdict.compiled,
        "correctness": verdict.correctness,
        "metadata": kb_correctness.json_safe_metadata(verdict.metadata),
        "feedback": list(verdict.feedback),
        "sticky": verdict.sticky,
        "oom_request_bytes": verdict.oom_request_bytes,
        "runtime_stats": dict(verdict.runtime_stats),
        "phases": dict(verdict.phases),
        "findings": list(verdict.findings),
        "reference_failure": verdict.reference_failure,
        "env": dict(verdict.env),
    }


def verdict_from_wire(wire: dict[str, Any]) -> Verdict:
    verdict = Verdict(**{k: v for k, v in wire.items() if k != "reference_failure"})
    verdict.reference_failure = tuple(wire["reference_failure"]) if wire["reference_failure"] else None
    return verdict
