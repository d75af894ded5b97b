"""One candidate, one clean process: the candidate process's side of a job (`serve`).

Every candidate is imported, constructed, run and (in faithful mode) checked and timed in a fresh
single-use process that the persistent worker starts ahead of need (kb_process). The worker drives the
job over the process's one channel (kb_channel) and lends it copies of the reference data in buffers of
its own (kb_exchange); this module answers:

- `load`: import the candidate (or, for strict reference timing, the problem's Model), construct it as
  KernelBench does, report integrity findings;
- `trial`: one strict correctness trial: forward on lent inputs with the trial's RNG state, the output
  copied into the worker's output buffers (the worker compares: the expected output never comes here);
- `warmup`, `bind`, `call`: untimed warm-up calls, then calls on inputs the worker writes into the bound
  buffers, each output copied back and the device synchronised before `done` (the worker's clock spans
  each call, kb_drive);
- `faithful`: KernelBench's own loop, in this process as KernelBench runs it: the correctness trials
  compared here against lent copies of the expected outputs, then its CUDA-event timing loop; the result
  is KernelBench's (faithful mode takes it as KernelBench would, labelled untrusted);
- `escape`: faithful mode's side-stream probe; `check`: the integrity checks of a phase;
  `profile`: `op: profile`; `finish`: the process says goodbye and exits.

In strict mode nothing this process says enters a verdict's time or correctness: the worker times,
checks and counts on its side. What it reports (its own errors, shapes, findings) can only make its
own result worse.

`Integrity` holds the runtime checks: the settings the reference depends on are set by krefine before
the candidate is imported and compared after every phase; Python threads left running after a forward,
new native threads, functions the timer or the check depend on replaced, and outputs that are not plain
dense tensors are findings: warnings in faithful mode, errors (the candidate fails) in strict mode.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import torch

import kb_compile
import kb_correctness
import kb_feedback
import kb_reference
import kb_sandbox
import kb_tensors
import kb_timing
from kb_channel import Channel, Frame, ProtocolError
from kb_correctness import Verdict
from kb_exchange import Borrowed
from kb_feedback import CANDIDATE_ERRORS, get_error_name
from kb_memory import release_memory
from kb_reference import ReferenceFailure, TrialData
from kb_tensors import RngState

# Strict mode's reference timing draws its inputs from the problem's seed plus this offset (its time is
# cached per problem); candidates' timed calls use secret seeds (kb_strict).
STRICT_REFERENCE_KEY_OFFSET = 1_000_003
# A `call` whose number is this runs no forward: the worker times the hand-over alone (kb_drive).
NULL_CALL = -2
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


def dense_output_problem(output: Any, device: torch.device) -> str | None:
    """None for a plain dense tensor (or a list/tuple of them) on `device`; else what it is. `type()`
    rather than isinstance: a lazy wrapper can fake `__class__`."""
    if isinstance(output, (list, tuple)) and type(output) in (list, tuple):
        for item in output:
            problem = dense_output_problem(item, device)
            if problem is not None:
                return problem
        return None
    if type(output) is not torch.Tensor:
        return f"a {type(output).__module__}.{type(output).__qualname__}, not a plain torch.Tensor"
    if output.layout != torch.strided:
        return f"a tensor with layout {output.layout}, not a dense strided tensor"
    if output.device != device:
        return f"a tensor on {output.device}, not on {device}"
    return None


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
        alive = [
            t
            for t in _enumerate_threads()
            if t.ident not in self.threads and t.is_alive() and t not in kb_compile.HARNESS_THREADS
        ]
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


# ------------------------------------------------------------------------------------ construction


def construct_candidate(ref: Any, cls: type) -> Any:
    """`cls` constructed as KernelBench constructs ModelNew, for a reference source `ref` (its seed,
    device, dtype and init inputs): kb_profile's use."""
    return construct(ref.seed, ref.device, ref.dtype, ref.init_inputs(), cls)


def construct(seed: int, device: torch.device, dtype: torch.dtype, init: list[Any], cls: type) -> Any:
    """KernelBench: under no_grad, set_seed(seed) -> ModelNew(*init_inputs) -> assert forward ->
    .to(device, dtype) -> sync. Weights match the reference only by RNG replay."""
    with torch.no_grad():
        kb_reference.set_seed(seed)
        model: torch.nn.Module = cls(*init)
        if not hasattr(model, "forward"):
            raise AssertionError()
        model = model.to(device=device, dtype=dtype)
        kb_tensors.synchronize(device)
    return model


def construct_or_fail(
    verdict: Verdict, job: dict[str, Any], device: torch.device, init: list[Any], loaded: kb_compile.LoadResult
) -> Any:
    assert loaded.model_new is not None
    hardware = job["hardware"]
    try:
        return construct(job["seed"], device, kb_reference.DTYPES[job["precision"]], init, loaded.model_new)
    except RuntimeError as exc:
        # KernelBench catches only RuntimeError here: compiled=True, correctness=False.
        verdict.metadata["runtime_error"] = str(exc)
        verdict.metadata["runtime_error_name"] = get_error_name(exc)
        kb_correctness.fail_candidate_exception(verdict, exc, device, loaded.candidate_path, "while constructing ModelNew")
        return None
    except CANDIDATE_ERRORS as exc:
        # Anything else escapes KernelBench's eval; its batch script records compiled=False.
        verdict.compiled = False
        poisoned = kb_correctness.sticky_error(exc, device)
        if poisoned is not None:
            verdict.metadata = kb_correctness.kernelbench_cuda_error_metadata(poisoned, hardware, device)
            verdict.status, verdict.sticky, verdict.sticky_cause = "cuda_error", True, poisoned
        else:
            verdict.metadata = kb_correctness.other_error_metadata(exc, hardware, device)
            verdict.status = "runtime_error"
        verdict.feedback.append(
            "ModelNew(*get_init_inputs()) failed: ModelNew's constructor must accept the same arguments "
            f"as Model's.\n{kb_feedback.candidate_traceback(exc, loaded.candidate_path)}"
        )
        return None


def _fresh(value: Any) -> Any:
    if type(value) is torch.Tensor:
        return value.clone()
    if isinstance(value, (list, tuple)):
        return type(value)(_fresh(item) for item in value)
    return value


def _leaves(value: Any) -> list[Any]:
    if type(value) in (list, tuple):
        return [leaf for item in value for leaf in _leaves(item)]
    return [value]


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
        "reference_failure": list(verdict.reference_failure) if verdict.reference_failure else None,
        "env": kb_correctness.json_safe_metadata(verdict.env),
    }


# ---------------------------------------------------------------------------------------- serving


class RemoteReferenceFailure(ReferenceFailure):
    """The worker's cached reference forward failed for a trial; the worker fills in the details."""

    def __init__(self, index: int) -> None:
        Exception.__init__(self, f"reference failed in trial {index + 1}")
        self.captured = None  # type: ignore[assignment]
        self.index = index


# The worker's ops a candidate process answers (each a Servant method of that name), besides `finish`.
OPS = frozenset({"load", "trial", "warmup", "bind", "call", "faithful", "escape", "check", "profile"})


class Servant:
    """One job in a candidate process (module doc)."""

    def __init__(
        self, channel: Channel, device: torch.device, flusher: kb_timing.L2Flusher, profiler: Any = None
    ) -> None:
        self.channel = channel
        # kb_profile.profile, handed down by kb_process (a floor above this one).
        self.profiler = profiler
        self.device = device
        self.flusher = flusher
        self.borrowed = Borrowed(device)
        self.job: dict[str, Any] = {}
        self.model: Any = None
        self.path = ""
        self.integrity: Integrity | None = None
        self.pinned: dict[str, Any] = {}
        self.sandbox: dict[str, Any] = {}
        self.init: list[Any] = []
        self.inputs: list[Any] = []
        self.out: Any = None
        self.timing_args: list[Any] | None = None

    # -- frames

    def next(self) -> Frame:
        """The worker's next frame; `buffers` frames are taken on the way."""
        while True:
            frame = self.channel.recv()
            if frame.op == "buffers":
                self.borrowed.take(self.channel, frame)
                continue
            return frame

    def value(self, wire: Any) -> Any:
        return self.borrowed.value(wire)

    # -- the job

    def start(self, job: dict[str, Any]) -> None:
        """Pin the settings, take the job's scratch folder, enter the sandbox."""
        self.job = job
        apply_settings(job["settings"])
        self.pinned = settings_snapshot()
        torch.set_printoptions(precision=4, threshold=10, edgeitems=3, linewidth=80)  # as KernelBench's eval
        scratch = job["scratch"]
        os.makedirs(scratch, exist_ok=True)
        os.chdir(scratch)
        for name in ("HOME", "TMPDIR", "XDG_CACHE_HOME", "TORCH_EXTENSIONS_DIR"):
            os.environ[name] = scratch
        os.environ["TRITON_CACHE_DIR"] = os.path.join(scratch, "triton")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(scratch, "inductor")
        # Confinement only grants folders that exist (a stand-in candidate may come without a build).
        os.makedirs(job["build_dir"], exist_ok=True)
        self.sandbox = kb_sandbox.enter_candidate(scratch, [job["build_dir"], scratch])
        self.integrity = Integrity(job["mode"], self.device, self.pinned)

    def run(self) -> None:
        while True:
            frame = self.next()
            if frame.op == "finish":
                env = {"sandbox": self.sandbox, "pinned": self.pinned, "isolation": "process"}
                self.channel.send("bye", env=kb_correctness.json_safe_metadata(env))
                return
            if frame.op not in OPS:
                raise ProtocolError(f"an unknown op {frame.op!r}")
            getattr(self, frame.op)(frame)

    # -- load

    def load(self, frame: Frame) -> None:
        job = self.job
        verdict = Verdict(metadata={"hardware": job["hardware"], "device": str(self.device)})
        self.init = list(self.value(frame.raw("init")))
        if job["kind"] == "reference":
            self._load_reference(verdict)
        else:
            self._load_candidate(verdict)
        ok = self.model is not None and verdict.status == "correct"
        self.channel.send("loaded", ok=ok, verdict=verdict_to_wire(verdict))

    def _load_candidate(self, verdict: Verdict) -> None:
        build_dir = self.job["build_dir"]
        loaded = kb_compile.load_candidate(self.job["source"], build_dir, os.path.join(build_dir, "load.log"))
        self.path = loaded.candidate_path
        if not loaded.ok:
            kb_correctness.compile_failed(verdict, loaded)
            return
        assert self.integrity is not None
        ok = self.integrity.check_process(verdict, "at import")
        model = construct_or_fail(verdict, self.job, self.device, self.init, loaded)
        if model is None:
            if verdict.sticky:
                kb_correctness.kernelbench_sticky_result(verdict, self.job["hardware"], self.device)
            return
        ok = self.integrity.check_process(verdict, "in ModelNew's constructor") and ok
        if ok:
            self.model = model

    def _load_reference(self, verdict: Verdict) -> None:
        """Strict reference timing: the problem's Model built as the worker builds it (set_seed, init
        inputs, .to), compiled when `eval.reference = "compile"`."""
        try:
            problem = kb_reference.load_problem(self.job["reference_code"])
            model = construct(
                self.job["seed"], self.device, kb_reference.DTYPES[self.job["precision"]], self.init, problem.model
            )
            spec = self.job.get("reference_compile")
            self.model = kb_reference.compiled_reference(model, spec)
        except CANDIDATE_ERRORS as exc:
            verdict.status, verdict.correctness = "runtime_error", False
            verdict.feedback.append(kb_feedback.exception_line(exc))

    # -- strict correctness trials

    def trial(self, frame: Frame) -> None:
        index, trials, seed = frame.get_int("index"), frame.get_int("trials"), frame.get_int("seed")
        inputs = list(self.value(frame.raw("inputs")))
        out = self.value(frame.raw("out"))
        rng = _rng_from_wire(frame.get_dict("rng"))
        label = f"in correctness trial {index + 1} of {trials}"
        verdict = Verdict()
        assert self.integrity is not None
        reply: dict[str, Any] = {"index": index}
        with torch.no_grad():
            kb_reference.set_seed(seed)
            try:
                self.model = self.model.to(device=self.device, dtype=kb_reference.DTYPES[self.job["precision"]])
                kb_tensors.restore_rng(rng, self.device)
                kb_tensors.poison_free_memory(out, self.device)
                output = self.model(*inputs)
                kb_tensors.synchronize(self.device)
                if not self.integrity.after_forward(verdict, output, label):
                    reply["verdict"] = verdict_to_wire(verdict)
                else:
                    reply.update(_copy_out(output, out, self.device))
            except CANDIDATE_ERRORS as exc:
                reply["verdict"] = self._exception(verdict, exc, label)
        if "verdict" not in reply and verdict.findings:
            reply["findings"] = list(verdict.findings)
        self.channel.send("trial_done", **reply)

    def _exception(self, verdict: Verdict, exc: BaseException, label: str) -> dict[str, Any]:
        verdict.metadata["runtime_error"] = kb_feedback.kernelbench_truncate(str(exc))
        verdict.metadata["runtime_error_name"] = get_error_name(exc)
        if kb_correctness.fail_candidate_exception(verdict, exc, self.device, self.path, label):
            kb_correctness.kernelbench_sticky_result(verdict, self.job["hardware"], self.device)
        return verdict_to_wire(verdict)

    # -- calls the worker times

    def warmup(self, frame: Frame) -> None:
        inputs = list(self.value(frame.raw("inputs")))
        reply: dict[str, Any] = {}
        try:
            with torch.no_grad():
                for _ in range(frame.get_int("count")):
                    self.model(*_fresh(inputs))
                    kb_tensors.synchronize(self.device)
        except CANDIDATE_ERRORS as exc:
            reply["verdict"] = self._exception(Verdict(), exc, "while timing")
        self.channel.send("warm", **reply)

    def bind(self, frame: Frame) -> None:
        self.inputs = list(self.value(frame.raw("inputs")))
        self.out = self.value(frame.raw("out"))
        self.channel.send("bound")

    def call(self, frame: Frame) -> None:
        n = frame.get_int("n")
        if n == NULL_CALL:  # the worker measures the hand-over alone: a device step, no forward
            if self.device.type == "cuda":
                torch.empty(1, device=self.device).zero_()
            kb_tensors.synchronize(self.device)
            self.channel.send("done", n=n)
            return
        try:
            with torch.no_grad():
                output = self.model(*self.inputs)
            reply = _copy_out(output, self.out, self.device)
        except CANDIDATE_ERRORS as exc:
            reply = {"verdict": self._exception(Verdict(), exc, "while timing")}
        self.channel.send("done", n=n, **reply)

    # -- faithful mode: KernelBench's loop in this process

    def faithful(self, frame: Frame) -> None:
        job = self.job
        verdict = Verdict(metadata={"hardware": job["hardware"], "device": str(self.device)})
        assert self.integrity is not None
        ref = RemoteReference(self)
        started = _perf_counter()
        try:
            outcome = kb_correctness.run_trials(ref, self.model, job["trials"], verdict, self.path, self.integrity)
        except ReferenceFailure as failure:
            verdict.phases["correctness_s"] = _perf_counter() - started
            verdict.reference_failure = (job["trials"], failure.index)
            self.channel.send("faithful_done", verdict=verdict_to_wire(verdict))
            return
        except CANDIDATE_ERRORS as exc:
            # Outside the per-trial try (e.g. ModelNew.to failing): KernelBench's outer catch.
            self._exception(verdict, exc, "during the correctness check")
            outcome = kb_correctness.LoopOutcome(0, stop=True, poisoned=verdict.sticky)
        verdict.phases["correctness_s"] = _perf_counter() - started
        if outcome.poisoned:
            if verdict.sticky_cause is not None:
                kb_correctness.kernelbench_sticky_result(verdict, job["hardware"], self.device)
        elif not outcome.stop:
            verdict.correctness = outcome.passed == job["trials"]
            verdict.feedback.append(
                kb_feedback.correctness_summary(outcome.passed, job["trials"], ref.precision, ref.atol, ref.rtol)
            )
            verdict.status = "correct" if verdict.correctness else "incorrect"
            checked = verdict.correctness and self.integrity.check_process(verdict, "after the correctness trials")
            if checked and job["timing"]["measure"]:
                self._faithful_timing(verdict, ref)
        else:
            verdict.correctness = False
        # KernelBench's check left its temporaries (COMPARE_FACTOR times the output) in this process's
        # allocator: back to the device before the worker's probes, which lend and check beside it
        # (kb_memory.Footprint.reserve).
        release_memory(self.device)
        self.channel.send("faithful_done", verdict=verdict_to_wire(verdict))

    def _faithful_timing(self, verdict: Verdict, ref: RemoteReference) -> None:
        timing = self.job["timing"]
        started = _perf_counter()
        try:
            self.model = self.model.to(device=self.device, dtype=ref.dtype)
            kb_tensors.synchronize(self.device)
            self.timing_args = ref.timing_inputs()
            times = kb_timing.time_callable(self.model, self.timing_args, self.device, timing, self.flusher)
            verdict.runtime_stats = kb_timing.runtime_stats(times)
        except CANDIDATE_ERRORS as exc:
            verdict.phases["timing_s"] = _perf_counter() - started
            verdict.metadata["error_during_performance"] = str(exc)
            if kb_correctness.fail_candidate_exception(verdict, exc, self.device, self.path, "while timing"):
                kb_correctness.kernelbench_sticky_result(verdict, self.job["hardware"], self.device)
            else:
                verdict.status = "correct"  # KernelBench keeps correctness; only the runtime stays -1
            return
        verdict.phases["timing_s"] = _perf_counter() - started
        assert self.integrity is not None
        if not self.integrity.check_process(verdict, "after timing"):
            verdict.runtime_stats = {}

    def escape(self, frame: Frame) -> None:
        """Faithful mode's side-stream probe on KernelBench's timing inputs (kb_timing.stream_escape_probe)."""
        try:
            args = self.timing_args if self.timing_args is not None else []
            event_ms, host_ms = kb_timing.stream_escape_probe(self.model, args, self.device)
            self.channel.send("escape", event_ms=event_ms, host_ms=host_ms)
        except CANDIDATE_ERRORS as exc:
            self.channel.send("escape", error=kb_feedback.exception_line(exc))

    def check(self, frame: Frame) -> None:
        verdict = Verdict()
        assert self.integrity is not None
        ok = self.integrity.check_process(verdict, frame.get_str("phase", limit=200))
        self.channel.send("checked", ok=ok, verdict=verdict_to_wire(verdict))

    def profile(self, frame: Frame) -> None:
        if self.profiler is None:
            raise ProtocolError("a profile this process cannot run")
        result = self.profiler(frame.get_dict("request"), kb_reference.ReferenceCache(), os.getcwd())
        self.channel.send("profiled", result=kb_correctness.json_safe_metadata(result))


def _copy_out(output: Any, out: Any, device: torch.device) -> dict[str, Any]:
    """The output copied into the worker's buffers, the device synchronised (work on every stream done);
    or, when it cannot go there, what it is instead (shape, dtype, structure) for the worker's verdict."""
    got, slots = _leaves(output), _leaves(out)
    if len(got) != len(slots):
        return {"mismatch": "structure", "got": f"{len(got)} output(s)", "expected": f"{len(slots)}"}
    for value, slot in zip(got, slots, strict=True):
        if type(value) is not torch.Tensor:
            return {"mismatch": "type", "got": type(value).__name__, "expected": "Tensor"}
        if tuple(value.shape) != tuple(slot.shape):
            return {"mismatch": "shape", "got": str(value.shape), "expected": str(slot.shape)}
        if value.dtype != slot.dtype:
            return {"mismatch": "dtype", "got": str(value.dtype), "expected": str(slot.dtype)}
    with torch.no_grad():
        for value, slot in zip(got, slots, strict=True):
            slot.copy_(value)
    kb_tensors.synchronize(device)
    return {}


def _rng_from_wire(wire: dict[str, Any]) -> RngState:
    cpu = torch.frombuffer(bytearray(bytes.fromhex(wire["cpu"])), dtype=torch.uint8).clone()
    cuda = wire.get("cuda")
    cuda_state = torch.frombuffer(bytearray(bytes.fromhex(cuda)), dtype=torch.uint8).clone() if cuda else None
    return RngState(cpu, cuda_state)


def rng_to_wire(state: RngState) -> dict[str, Any]:
    return {
        "cpu": bytes(state.cpu.numpy().tobytes()).hex(),
        "cuda": bytes(state.cuda.numpy().tobytes()).hex() if state.cuda is not None else None,
    }


class RemoteReference:
    """Faithful mode's view of the worker's reference data (kb_correctness.ReferenceSource): trials and
    timing inputs lent as copies on request."""

    def __init__(self, servant: Servant) -> None:
        job = servant.job
        self.servant = servant
        self.device = servant.device
        self.precision = job["precision"]
        self.dtype = kb_reference.DTYPES[self.precision]
        self.mode = job["mode"]
        self.seed = job["seed"]
        self.atol, self.rtol = float(job["atol"]), float(job["rtol"])

    def _ask(self, what: str, **fields: Any) -> Frame:
        self.servant.channel.send("ask", what=what, **fields)
        frame = self.servant.next()
        if frame.op != "answer":
            raise ProtocolError(f"a {frame.op!r} frame where an answer was due")
        return frame

    def trial_seeds(self, trials: int) -> list[int]:
        return kb_reference.trial_seeds(self.seed, trials)

    def trial(self, trials: int, index: int, seed: int) -> TrialData:
        answer = self._ask("trial", trials=trials, index=index, seed=seed)
        if answer.get_bool("reference_failed", optional=True):
            raise RemoteReferenceFailure(index)
        inputs = list(self.servant.value(answer.raw("inputs")))
        wire = answer.raw("expected")
        if type(wire) is dict and wire.get("t") == "alias":
            expected = inputs[int(wire["input"])]  # the reference's output is (a view of) this input
        else:
            expected = self.servant.value(wire)
        return TrialData(inputs, expected, _rng_from_wire(answer.get_dict("rng")))

    def verify_trial(self, trials: int, index: int) -> bool:
        return bool(self._ask("verify", trials=trials, index=index).get_bool("unchanged"))

    def init_inputs(self) -> list[Any]:
        return list(self.servant.init)

    def timing_inputs(self) -> list[Any]:
        return list(self.servant.value(self._ask("timing_inputs").raw("inputs")))


def serve(channel: Channel, device: torch.device, flusher: kb_timing.L2Flusher, profiler: Any = None) -> None:
    """In a candidate process, once its device step is done: take one job and serve it (module doc).
    `profiler` is kb_profile.profile (for `op: profile` jobs)."""
    servant = Servant(channel, device, flusher, profiler)
    frame = servant.next()
    if frame.op != "job":
        raise ProtocolError(f"a {frame.op!r} frame where a job was due")
    servant.start(frame.get_dict("job"))
    servant.run()
