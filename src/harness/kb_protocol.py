"""Message shapes of the worker protocol (docs/worker-protocol.md) and a small runtime checker.

The Rust side holds the same shapes as serde types; tests/fixtures/protocol/*.json are golden examples
that both sides check. The checker is deliberately tiny: it understands exactly the typing constructs
used below (TypedDict, Literal, list, dict, X | None, Any) and nothing else.
"""

from __future__ import annotations

import types
import typing
from typing import Any, Literal, TypedDict, Union

Precision = Literal["fp32", "fp16", "bf16"]
Mode = Literal["faithful", "strict"]
CompileStatus = Literal["ok", "compile_error"]
EvalStatus = Literal[
    "correct",
    "incorrect",
    "compile_error",
    "runtime_error",
    "cuda_error",
    "out_of_memory",
    "reference_error",
]
ProfileStatus = Literal[
    "ok", "compile_error", "runtime_error", "cuda_error", "out_of_memory", "reference_error"
]


# ---------------------------------------------------------------------------------------------- requests


class ProblemSpec(TypedDict):
    key: str
    code: str
    code_hash: str


class CandidateSpec(TypedDict):
    source: str
    build_dir: str


class ReferenceCompile(TypedDict):
    backend: str
    mode: str


class TimingOptions(TypedDict, total=False):
    # eval.timing_method (kb_timing.TIMING_METHODS); absent: cuda_event.
    method: Literal["cuda_event", "do_bench", "do_bench_impl", "host_time"]
    # eval.reference = "compile": torch.compile's backend and mode for timing the reference.
    reference_compile: ReferenceCompile


class TimingSpec(TimingOptions):
    measure: bool
    warmup: int
    trials: int
    discard_first: int
    l2_flush: bool


class ToleranceSpec(TypedDict):
    """`eval.tolerance` resolved to numbers by the orchestrator; absent: KernelBench's per precision."""

    name: str
    atol: float
    rtol: float


class RuntimeStats(TypedDict):
    mean: float
    median: float
    std: float
    min: float
    max: float
    num_trials: int


class BaselineRuntime(RuntimeStats):
    source: str


class ProbeSummary(TypedDict, total=False):
    """The precision probe's summary (kb_precision.Probe.wire): the inputs it used and the reference's
    own error against float64, or why it is not applicable."""

    kind: Literal["signed", "kernelbench"]
    e_ref: float
    why: str


class ReferenceOptions(TypedDict, total=False):
    """Optional fields of a ReferenceSpec (absent means the default)."""

    # eval.cast_integer_inputs: cast integer and bool inputs to the precision as KernelBench does;
    # absent or false, they keep their dtype.
    cast_integer_inputs: bool
    # eval.inputs: "device" draws the inputs on the device; absent, KernelBench's CPU generation.
    inputs: Literal["kernelbench", "device"]
    # The store entry of the problem's CPU-made inputs (src/worker/input_store.rs), when there is one.
    stored_inputs: str
    # eval.tolerance resolved to numbers; absent: KernelBench's per-precision table.
    tolerance: ToleranceSpec
    # An earlier run's precision probe of this problem on this kind of device (src/worker/probes.rs).
    precision_probe: ProbeSummary


class ReferenceSpec(ReferenceOptions):
    """The reference data a request works against, top-level fields of every request that reaches the
    reference (prepare, evaluate, profile): the Rust side's `ReferenceSpec`, flattened there too.
    kb_reference.ReferenceSpec reads it (and builds the worker's cache key from it)."""

    problem: ProblemSpec
    device: str
    precision: Precision
    mode: Mode
    seed: int
    correct_trials: int
    timing: TimingSpec
    reference_runtime: BaselineRuntime | None


class CompileOptions(TypedDict, total=False):
    # `fast` or `plain` (eval.build); absent: fast.
    build: str
    # False: start no background build of a shared precompiled header the child missed (absent: start).
    pch_background: bool


class CompileRequest(CompileOptions):
    id: int
    op: Literal["compile"]
    source: str
    build_dir: str
    arch_list: str | None
    log_path: str


class IntegritySpec(TypedDict):
    """The excessive-speedup guard's inputs: `eval.max_speedup`, or the device's peak numbers."""

    max_speedup: float | None
    peak_tflops: float | None
    peak_bandwidth_gbs: float | None


class EvaluateRequest(ReferenceSpec):
    id: int
    op: Literal["evaluate"]
    candidate: CandidateSpec
    integrity: IntegritySpec | None


class ProfileOptions(TypedDict, total=False):
    # eval.profiler: torch | ncu | both; absent: both where ncu, else torch.
    profiler: Literal["torch", "ncu", "both"]
    # The GPU's peaks for the roofline lines.
    peaks: IntegritySpec


class ProfileRequest(ReferenceSpec, ProfileOptions):
    id: int
    op: Literal["profile"]
    candidate: CandidateSpec
    row_limit: int
    ncu: bool


class PrepareOptions(TypedDict, total=False):
    """Optional fields of a prepare request (absent means the default)."""

    # Build at most this many steps (a trial, the timing inputs, the reference timing); absent: all.
    steps: int
    # False: do not time the reference yet (the orchestrator has not quieted the CPU); absent: true.
    quiet: bool


class PrepareRequest(ReferenceSpec, PrepareOptions):
    id: int
    op: Literal["prepare"]


class WarmHeadersRequest(TypedDict):
    """Build the shared precompiled headers of torch's default flags before candidates ask (a compile
    worker; no candidate code runs)."""

    id: int
    op: Literal["warm_headers"]
    # A build dir of the run's cache: the headers go to its `pch/` (kb_pch.pch_root_for).
    build_dir: str
    # How long to wait for the headers before answering; the builds go on after it.
    wait_s: float


class ShutdownRequest(TypedDict):
    id: int
    op: Literal["shutdown"]


REQUEST_SHAPES: dict[str, type] = {
    "compile": CompileRequest,
    "prepare": PrepareRequest,
    "evaluate": EvaluateRequest,
    "profile": ProfileRequest,
    "warm_headers": WarmHeadersRequest,
    "shutdown": ShutdownRequest,
}


# --------------------------------------------------------------------------------------------- responses


class DeviceInfo(TypedDict):
    name: str
    capability: list[int]
    total_memory_bytes: int


class Placement(TypedDict):
    host: str
    slurm_job_id: str | None
    slurm_step_id: str | None
    gpu_uuid: str | None
    toolchain: str


class ReadyMessage(TypedDict):
    id: int
    ok: Literal[True]
    kind: Literal["ready"]
    role: Literal["compile", "gpu"]
    python: str
    torch: str
    cuda: str | None
    cuda_available: bool
    device: DeviceInfo | None
    pid: int
    placement: Placement


class ErrorResponse(TypedDict):
    """A request the harness could not handle at all (malformed, or an internal harness error)."""

    id: int
    ok: Literal[False]
    kind: str
    error: str


class _CompileMeasures(TypedDict, total=False):
    # CPU seconds of the worker and its build children (getrusage): the build's cores are cpu_s /
    # duration_s, what the orchestrator's CPU budget claims for a build (absent from older workers).
    cpu_s: float
    # The worker started a background build of a shared precompiled header its child missed.
    pch_started: bool


class CompileResponse(_CompileMeasures):
    id: int
    ok: Literal[True]
    kind: Literal["compile"]
    status: CompileStatus
    error_name: str | None
    error: str | None
    feedback: str
    log_path: str
    duration_s: float
    # `fast`, `plain` or `fallback:<why>`; null when the candidate built no extension.
    build_path: str | None


class EvalEnvOptions(TypedDict, total=False):
    # The correctness tolerance the check used (absent in responses of older harnesses).
    tolerance: ToleranceSpec
    # `eager` or `compile (backend, mode)`: how the reference was timed.
    reference_mode: str


class EvalEnv(EvalEnvOptions):
    device_name: str
    torch: str
    cuda: str | None
    precision: Precision
    mode: Mode
    timing_method: Literal["cuda_event", "cpu_perf_counter", "do_bench", "do_bench_impl", "host_time"]
    grad_mode: Literal["no_grad"]
    tf32_matmul: bool
    tf32_cudnn: bool
    # The settings krefine set in the candidate's process before importing it (the reference's).
    settings: dict[str, Any] | None
    # What kb_sandbox.enter_candidate applied in the candidate's process.
    sandbox: Any
    isolation: Literal["process", "in_worker"]
    integer_inputs: Literal["kept", "cast"]
    inputs: Literal["kernelbench", "device"]
    transformers: str | None
    python: str


class EvalPhases(TypedDict):
    load_s: float
    reference_s: float
    correctness_s: float
    timing_s: float
    ref_timing_s: float
    # Handing the job and the reference data to the candidate's process, and its exit.
    isolation_s: float
    # Waiting for a warm candidate process (zero when one was ready).
    spawn_wait_s: float


class Finding(TypedDict):
    category: str
    severity: Literal["warning", "error"]
    message: str


class SpeedupCheck(TypedDict):
    bound: float
    bound_source: Literal["roofline", "config", "default"]
    flagged: bool
    verified: bool | None
    reverified_speedup: float | None


class PrepareResponse(TypedDict):
    id: int
    ok: Literal[True]
    kind: Literal["prepare"]
    status: Literal["ready", "reference_error"]
    seconds: float
    tiers: list[str]
    device_bytes: int
    host_bytes: int
    parallel_inputs: int
    feedback: str
    # Nothing is left to build (everything is cached, or the reference failed).
    done: bool
    # What the next request would build first; null when done.
    next: Literal["trial", "timing_inputs", "reference_timing"] | None
    # Correctness trials built so far (in order: trial k only after trial k - 1).
    trials_ready: int
    # What this request built: "trial 3", "timing inputs", "reference timing".
    built: list[str]


class ProgressNotice(TypedDict):
    """Sent during an evaluate, before its response, with the evaluate's id: reference work (building
    trial data or timing inputs, timing the reference) starts or ends. The orchestrator charges that
    time to eval.timeouts.reference_s instead of the candidate's execute_s."""

    id: int
    ok: Literal[True]
    kind: Literal["progress"]
    reference: Literal["start", "end"]


class _EvaluateOptions(TypedDict, total=False):
    # The worker's own precision probe of this problem, when it made one (not from a hint): the
    # orchestrator sends it back as `precision_probe` in the next run's requests.
    precision_probe: ProbeSummary


class EvaluateResponse(_EvaluateOptions):
    id: int
    ok: Literal[True]
    kind: Literal["evaluate"]
    status: EvalStatus
    compiled: bool
    correctness: bool
    metadata: dict[str, Any]
    runtime: float
    runtime_stats: RuntimeStats | dict[str, Any]
    ref_runtime: float
    ref_runtime_stats: RuntimeStats | dict[str, Any]
    ref_runtime_source: str | None
    speedup: float | None
    feedback: str
    env: EvalEnv
    phases: EvalPhases
    sticky: bool
    findings: list[Finding]
    speedup_check: SpeedupCheck | None


class NcuMetrics(TypedDict):
    duration_ns: float
    achieved_occupancy: float | None
    dram_throughput_pct: float | None
    sm_throughput_pct: float | None
    num_kernels: int


class ProfileResponse(TypedDict):
    id: int
    ok: Literal[True]
    kind: Literal["profile"]
    status: ProfileStatus
    table: str
    ncu: NcuMetrics | None
    note: str | None
    duration_s: float
    sticky: bool


class WarmHeadersResponse(TypedDict):
    id: int
    ok: Literal[True]
    kind: Literal["warm_headers"]
    # Header builds started (0: made before, or none can be made here).
    started: int
    # Of those, still building when the wait ended.
    pending: int


class ShutdownResponse(TypedDict):
    id: int
    ok: Literal[True]
    kind: Literal["shutdown"]


RESPONSE_SHAPES: dict[str, type] = {
    "ready": ReadyMessage,
    "compile": CompileResponse,
    "prepare": PrepareResponse,
    "progress": ProgressNotice,
    "evaluate": EvaluateResponse,
    "profile": ProfileResponse,
    "warm_headers": WarmHeadersResponse,
    "shutdown": ShutdownResponse,
}


# ------------------------------------------------------------------------------------------------ checker


def _is_typeddict(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, dict) and hasattr(tp, "__required_keys__")


def _hints(tp: type) -> dict[str, Any]:
    # include_extras=False strips NotRequired[...] so we see the plain value type.
    return typing.get_type_hints(tp)


def check_shape(value: Any, tp: Any, path: str = "$", allow_extra: bool = False) -> list[str]:
    """Return a list of problems (empty when `value` matches `tp`)."""
    if tp is Any:
        return []
    origin = typing.get_origin(tp)
    if origin is Union or isinstance(tp, types.UnionType):
        options = typing.get_args(tp)
        attempts = [check_shape(value, option, path, allow_extra) for option in options]
        if any(not problems for problems in attempts):
            return []
        # Report against the option the value was most likely meant as: never "expected null" for a
        # present value, and otherwise the attempt with the fewest problems.
        meant = [
            a for a, o in zip(attempts, options, strict=True) if value is None or o is not type(None)
        ] or attempts
        return min(meant, key=len)
    if origin is Literal:
        allowed = typing.get_args(tp)
        # `True == 1` in Python, so compare types too: a literal True must be a bool.
        if any(value == a and type(value) is type(a) for a in allowed):
            return []
        return [f"{path}: expected one of {list(allowed)}, got {value!r}"]
    if tp is type(None):
        return [] if value is None else [f"{path}: expected null, got {type(value).__name__}"]
    if tp is bool:
        return [] if isinstance(value, bool) else [f"{path}: expected bool, got {value!r}"]
    if tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
        return [] if ok else [f"{path}: expected int, got {value!r}"]
    if tp is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return [] if ok else [f"{path}: expected number, got {value!r}"]
    if tp is str:
        return [] if isinstance(value, str) else [f"{path}: expected string, got {type(value).__name__}"]
    if origin is list:
        if not isinstance(value, list):
            return [f"{path}: expected list, got {type(value).__name__}"]
        (item_tp,) = typing.get_args(tp)
        problems: list[str] = []
        for index, item in enumerate(value):
            problems += check_shape(item, item_tp, f"{path}[{index}]", allow_extra)
        return problems
    if origin is dict:
        if not isinstance(value, dict):
            return [f"{path}: expected object, got {type(value).__name__}"]
        key_tp, item_tp = typing.get_args(tp)
        problems = []
        for key, item in value.items():
            problems += check_shape(key, key_tp, f"{path}.<key>", allow_extra)
            problems += check_shape(item, item_tp, f"{path}.{key}", allow_extra)
        return problems
    if _is_typeddict(tp):
        return _check_typeddict(value, tp, path, allow_extra)
    raise TypeError(f"check_shape does not understand {tp!r}")


def _check_typeddict(value: Any, tp: type, path: str, allow_extra: bool) -> list[str]:
    if not isinstance(value, dict):
        return [f"{path}: expected object {tp.__name__}, got {type(value).__name__}"]
    hints = _hints(tp)
    required = sorted(tp.__required_keys__)  # type: ignore[attr-defined]
    problems = [f"{path}: missing field {key!r}" for key in required if key not in value]
    for key, item in value.items():
        if key not in hints:
            if not allow_extra:
                problems.append(f"{path}: unknown field {key!r}")
            continue
        problems += check_shape(item, hints[key], f"{path}.{key}", allow_extra)
    return problems


def check_request(message: Any, allow_extra: bool = True) -> list[str]:
    """Problems with a request. The serve loop tolerates unknown fields so Rust may add some first;
    golden fixtures are checked strictly."""
    if not isinstance(message, dict):
        return ["$: a request must be a JSON object"]
    op = message.get("op")
    shape = REQUEST_SHAPES.get(op) if isinstance(op, str) else None
    if shape is None:
        return [f"$.op: unknown op {op!r} (expected one of {sorted(REQUEST_SHAPES)})"]
    return check_shape(message, shape, allow_extra=allow_extra)


def check_response(message: Any) -> list[str]:
    """Problems with an outgoing response; strict, so the harness never emits an undocumented field."""
    if isinstance(message, dict) and message.get("ok") is False:
        return check_shape(message, ErrorResponse)
    kind = message.get("kind") if isinstance(message, dict) else None
    shape = RESPONSE_SHAPES.get(kind) if isinstance(kind, str) else None
    if shape is None:
        return [f"$.kind: unknown kind {kind!r}"]
    return check_shape(message, shape)


def check_message(message: Any) -> list[str]:
    """Check any protocol message: requests carry `op`, responses carry `kind`."""
    if isinstance(message, dict) and "op" in message:
        return check_request(message, allow_extra=False)
    return check_response(message)
