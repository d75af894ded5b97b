"""Checking one candidate against the reference: the verdict, KernelBench's correctness loop and
comparison, and the classification of the candidate's failures (metadata exactly as KernelBench writes
it).

KernelBench's loop (`run_trials`) runs in the candidate's own single-use process in faithful mode
(kb_candidate), against copies of the worker's reference data lent through any object with the
`ReferenceSource` shape; strict mode's trials are run by the worker (kb_drive), which uses
`compare_trial` here on its side.
"""

from __future__ import annotations

import math
import re
import traceback
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

import kb_feedback
from kb_feedback import CANDIDATE_ERRORS, get_error_name
from kb_memory import SLICE_ELEMENTS
from kb_reference import TrialData, release_memory, set_seed
from kb_tensors import restore_rng, synchronize

STICKY_MARKERS = (
    "CUDA error",
    "illegal memory access",
    "device-side assert",
    "unspecified launch failure",
)
# Captured when this module is imported, before any candidate code: a candidate that replaces
# torch.allclose (or torch.equal) in its process does not change what the check calls.
_ALLCLOSE = torch.allclose


class ReferenceSource(Protocol):
    """What KernelBench's loop needs from the reference: kb_candidate.RemoteReference in a candidate
    process (copies of the worker's data, lent on request)."""

    device: torch.device
    dtype: torch.dtype
    precision: str
    mode: str
    seed: int
    atol: float
    rtol: float

    def trial_seeds(self, trials: int) -> list[int]: ...
    def trial(self, trials: int, index: int, seed: int) -> TrialData: ...
    def verify_trial(self, trials: int, index: int) -> bool: ...
    def init_inputs(self) -> list[Any]: ...
    def timing_inputs(self) -> list[Any]: ...


class OutputGuard(Protocol):
    """Integrity checks run after each candidate forward (kb_candidate.Integrity)."""

    def after_forward(self, verdict: Verdict, output: Any, label: str) -> bool: ...


# ------------------------------------------------------------------------------------ failure handling


def is_out_of_memory(exc: BaseException) -> bool:
    text = str(exc)
    return isinstance(exc, torch.OutOfMemoryError) or "can't allocate memory" in text


_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40, "PiB": 1 << 50}
_UNITS.update({"KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "PB": 10**15, "EB": 10**18})
_UNITS["EiB"] = 1 << 60


def oom_request_bytes(text: str) -> int | None:
    """The size of the allocation that failed, from torch's CUDA ("Tried to allocate 6.00 GiB") or
    CPU ("you tried to allocate 123 bytes") message; None when the message does not say."""
    match = re.search(r"you tried to allocate (\d+) bytes", text)
    if match:
        return int(match.group(1))
    # "Tried to allocate 6.00 GiB", or for absurd sizes "Tried to allocate more than 1EB memory".
    match = re.search(r"Tried to allocate (?:more than )?([\d.]+) ?([KMGTPE]?i?B)\b", text)
    if match and match.group(2) in _UNITS:
        return int(float(match.group(1)) * _UNITS[match.group(2)])
    return None


def cache_could_have_caused(verdict: Verdict, cached_bytes: int, device: torch.device) -> bool:
    """Could freeing `cached_bytes` of reference data have let the failed allocation succeed?"""
    if verdict.status != "out_of_memory" or verdict.sticky or cached_bytes <= 0:
        return False
    wanted = verdict.oom_request_bytes
    if wanted is None:
        return True
    free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else 0
    return wanted <= cached_bytes + free


def sticky_error(exc: BaseException, device: torch.device) -> BaseException | None:
    """The error that poisons the CUDA context, if any: the failing sync after `exc`, or `exc` itself
    when its text names a sticky CUDA failure. None when the context is still usable."""
    if device.type != "cuda":
        return None
    try:
        torch.cuda.synchronize(device=device)
    except Exception as sync_exc:  # noqa: BLE001 - any failure here means the context is gone
        return sync_exc
    if any(marker in str(exc) for marker in STICKY_MARKERS):
        return exc
    return None


# ---------------------------------------------------------------------------------------- the verdict


@dataclass
class Verdict:
    """Everything evaluate() reports; filled in phase by phase."""

    status: str = "correct"
    compiled: bool = True
    correctness: bool = False
    metadata: dict[str, Any] = field(default_factory=dict)
    feedback: list[str] = field(default_factory=list)
    sticky: bool = False
    sticky_cause: BaseException | None = None
    oom_request_bytes: int | None = None
    runtime_stats: dict[str, Any] = field(default_factory=dict)
    ref_runtime_stats: dict[str, Any] = field(default_factory=dict)
    ref_runtime_source: str | None = None
    # Runtime integrity findings ({"category", "severity", "message"}), see kb_candidate.Integrity.
    findings: list[dict[str, Any]] = field(default_factory=list)
    # (trials, index) of a correctness trial whose cached reference forward failed: the worker, which
    # holds the reference's exception, fills in KernelBench's metadata for it.
    reference_failure: tuple[int, int] | None = None
    # The candidate process's settings and sandbox, merged into the result's env.
    env: dict[str, Any] = field(default_factory=dict)
    # The excessive-speedup guard (kb_eval), when a speedup was measured.
    speedup_check: dict[str, Any] | None = None
    phases: dict[str, float] = field(
        default_factory=lambda: {
            "load_s": 0.0,
            "reference_s": 0.0,
            "correctness_s": 0.0,
            "timing_s": 0.0,
            "ref_timing_s": 0.0,
        }
    )


def fail_candidate_exception(
    verdict: Verdict, exc: BaseException, device: torch.device, candidate_path: str, what: str
) -> bool:
    """Classify an exception raised by candidate code (sticky CUDA error, OOM, plain runtime error),
    set status and feedback. Returns True when the context is poisoned (stop touching the GPU)."""
    poisoned = sticky_error(exc, device)
    detail = kb_feedback.candidate_traceback(exc, candidate_path)
    if poisoned is not None:
        verdict.status, verdict.sticky, verdict.sticky_cause = "cuda_error", True, poisoned
        verdict.feedback.append(
            f"CUDA error {what}: the kernel left the GPU context unusable (typically an out-of-bounds "
            f"memory access or a failed launch).\n{detail}"
        )
        return True
    if is_out_of_memory(exc):
        verdict.status = "out_of_memory"
        verdict.oom_request_bytes = oom_request_bytes(str(exc))
        verdict.feedback.append(f"Out of memory {what}.\n{detail}")
        release_memory(device)
        return False
    verdict.status = "runtime_error"
    verdict.feedback.append(f"Runtime error {what}.\n{detail}")
    return False


def kernelbench_cuda_error_metadata(
    exc: BaseException, hardware: str, device: torch.device
) -> dict[str, Any]:
    """What KernelBench's batch script records when a sticky error escapes eval (its final sync)."""
    return {
        "cuda_error": f"CUDA Error: {exc}",
        "cuda_error_name": get_error_name(exc),
        "hardware": hardware,
        "device": str(device),
    }


def other_error_metadata(exc: BaseException, hardware: str, device: torch.device) -> dict[str, Any]:
    """What KernelBench's batch script records for any other exception escaping eval."""
    return {
        "other_error": f"error: {exc}",
        "other_error_name": get_error_name(exc),
        "hardware": hardware,
        "device": str(device),
    }


# ------------------------------------------------------------------------------------ correctness loop


def unravel(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    """torch.unravel_index of one flat index, in Python: torch's imports sympy on its first call, which
    cost a failing check 1-3 s in every fresh candidate process (bench/gpu/lazy_load.py)."""
    out: list[int] = []
    for size in reversed(shape):
        flat, index = divmod(flat, size) if size > 0 else (flat, 0)
        out.append(index)
    return tuple(reversed(out))


def mismatch_detail(
    trial: int, expected: torch.Tensor, got: torch.Tensor, atol: float, rtol: float, diff: torch.Tensor
) -> kb_feedback.Mismatch | None:
    """Numbers for the E text beyond KernelBench's max/avg: how many elements fail and where first.
    `diff` is `|expected - got|`, computed once for KernelBench's max/avg too. Best effort only: it
    never changes the verdict. Kept to a few passes over the output (a 200 MB output on a CPU costs
    seconds per pass)."""
    try:
        # torch.isclose(expected, got, rtol=rtol, atol=atol) with equal_nan=False, from the difference:
        # equal values are close (infinities too), NaN never, other non-finite pairs never.
        finite = torch.isfinite(diff)
        bad_mask = ~((diff <= got.abs().mul_(rtol).add_(atol)) & finite) & (expected != got)
        bad = int(bad_mask.sum().item())
        first_index: tuple[int, ...] | None = None
        expected_value = got_value = None
        if bad:
            flat = int(bad_mask.reshape(-1).to(torch.uint8).argmax().item())
            first_index = unravel(flat, tuple(expected.shape))
            expected_value = float(expected.reshape(-1)[flat].item())
            got_value = float(got.reshape(-1)[flat].item())
        nonfinite = 0
        if not bool(finite.all().item()):
            nonfinite = int((~torch.isfinite(got) & torch.isfinite(expected)).sum().item())
        return kb_feedback.Mismatch(
            trial=trial,
            max_abs=float(diff.max().item()),
            mean_abs=float(diff.mean().item()),
            bad=bad,
            total=expected.numel(),
            first_index=first_index,
            expected=expected_value,
            got=got_value,
            nonfinite=nonfinite,
        )
    except Exception:  # noqa: BLE001 - feedback detail only
        return None


@dataclass
class TrialComparison:
    """One correctness trial's comparison: `shapes` (expected, got, as text) on a shape mismatch, else
    whether it passed and, when not, KernelBench's max/avg difference and our detail."""

    shapes: tuple[str, str] | None = None
    passed: bool = False
    max_diff: float = 0.0
    avg_diff: float = 0.0
    detail: kb_feedback.Mismatch | None = None


def sliced_allclose(expected: torch.Tensor, got: torch.Tensor, atol: float, rtol: float) -> bool:
    """torch.allclose (captured at import) on tensors of one shape, slice by slice along the leading
    dimensions (at most SLICE_ELEMENTS each): the same answer, since the test is elementwise, with one
    slice's temporaries instead of a whole output's (kb_memory). The worker's comparison."""
    if expected.shape != got.shape or expected.dim() == 0 or expected.numel() <= SLICE_ELEMENTS:
        return bool(_ALLCLOSE(expected, got, atol=atol, rtol=rtol))
    rows = expected.shape[0]
    per_row = expected.numel() // rows
    if per_row > SLICE_ELEMENTS:
        return all(sliced_allclose(expected[i], got[i], atol, rtol) for i in range(rows))
    step = SLICE_ELEMENTS // per_row
    return all(
        bool(_ALLCLOSE(expected[i : i + step], got[i : i + step], atol=atol, rtol=rtol)) for i in range(0, rows, step)
    )


def sliced_mismatch(trial: int, expected: torch.Tensor, got: torch.Tensor, atol: float, rtol: float) -> TrialComparison:
    """A failed comparison's figures (KernelBench's max and mean difference, mismatch_detail's counts and
    first failing element) made slice by slice, as sliced_allclose compares: the worker never holds a
    whole output's difference beside the candidate's process (kb_memory)."""
    flat_expected, flat_got = expected.reshape(-1), got.reshape(-1)
    total = flat_expected.numel()
    max_abs, abs_sum, bad, nonfinite = 0.0, 0.0, 0, 0
    first: tuple[int, float | None, float | None] | None = None
    detailed = True
    for start in range(0, total, SLICE_ELEMENTS):
        want, have = flat_expected[start : start + SLICE_ELEMENTS], flat_got[start : start + SLICE_ELEMENTS]
        diff = torch.abs(want - have)
        part_max = float(torch.max(diff).item())
        max_abs = part_max if math.isnan(part_max) or math.isnan(max_abs) else max(max_abs, part_max)
        abs_sum += float(diff.sum(dtype=torch.float64).item())
        part = mismatch_detail(trial, want, have, atol, rtol, diff) if detailed else None
        if part is None:
            detailed = False
            continue
        bad, nonfinite = bad + part.bad, nonfinite + part.nonfinite
        if first is None and part.first_index is not None:
            first = (start + part.first_index[0], part.expected, part.got)
    avg_abs = abs_sum / total
    detail = None
    if detailed:
        first_index = None
        if first is not None:
            first_index = unravel(first[0], tuple(expected.shape))
        detail = kb_feedback.Mismatch(
            trial=trial,
            max_abs=max_abs,
            mean_abs=avg_abs,
            bad=bad,
            total=total,
            first_index=first_index,
            expected=first[1] if first else None,
            got=first[2] if first else None,
            nonfinite=nonfinite,
        )
    return TrialComparison(max_diff=max_abs, avg_diff=avg_abs, detail=detail)


def compare_trial(
    output: Any, output_new: Any, atol: float, rtol: float, index: int, sliced: bool = False
) -> TrialComparison:
    """KernelBench's comparison of trial `index`'s output (`output` expected, `output_new` the
    candidate's): the shape, then torch.allclose (captured at import), then the differences. Where it
    runs: in the candidate's process in faithful mode, as KernelBench does; in the worker in strict mode
    (kb_drive), where the expected output never leaves, `sliced` (sliced_allclose: the worker's
    temporaries stay small beside the candidate's process)."""
    if output.shape != output_new.shape:
        return TrialComparison(shapes=(str(output.shape), str(output_new.shape)))
    close = sliced_allclose(output, output_new, atol, rtol) if sliced else _ALLCLOSE(output, output_new, atol=atol, rtol=rtol)
    if close:
        return TrialComparison(passed=True)
    if sliced and output.numel() > SLICE_ELEMENTS:
        return sliced_mismatch(index + 1, output, output_new, atol, rtol)
    # KernelBench's torch.max/torch.mean(torch.abs(output - output_new)), computed once.
    diff = torch.abs(output - output_new)
    max_diff = torch.max(diff).item()
    avg_diff = torch.mean(diff).item()
    return TrialComparison(
        max_diff=max_diff, avg_diff=avg_diff, detail=mismatch_detail(index + 1, output, output_new, atol, rtol, diff)
    )


@dataclass
class LoopOutcome:
    passed: int
    stop: bool  # the loop returned early (shape mismatch, exception, modified input, reference failure)
    poisoned: bool = False


def run_trials(
    ctx: ReferenceSource,
    model_new: torch.nn.Module,
    trials: int,
    verdict: Verdict,
    candidate_path: str,
    guard: OutputGuard | None = None,
) -> LoopOutcome:
    """KernelBench's run_and_check_correctness (faithful mode) with the reference served by the worker."""
    atol, rtol = ctx.atol, ctx.rtol
    metadata = verdict.metadata
    passed = 0
    mismatches: list[kb_feedback.Mismatch] = []
    wrote_inputs: list[int] = []
    seeds = ctx.trial_seeds(trials)
    with torch.no_grad():
        for index, seed in enumerate(seeds):
            label = f"in correctness trial {index + 1} of {trials}"
            # ReferenceFailure escapes, as in KernelBench.
            data = ctx.trial(trials, index, seed)
            set_seed(seed)
            model_new = model_new.to(device=ctx.device, dtype=ctx.dtype)
            restore_rng(data.rng, ctx.device)
            inputs = data.inputs
            output = data.output
            try:
                output_new = model_new(*inputs)
                synchronize(ctx.device)
                if guard is not None and not guard.after_forward(verdict, output_new, label):
                    ctx.verify_trial(trials, index)
                    return LoopOutcome(passed, stop=True)
                compared = compare_trial(output, output_new, atol, rtol, index)
                if compared.shapes is not None:
                    expected_shape, got_shape = compared.shapes
                    message = f"Output shape mismatch: Expected {expected_shape}, got {got_shape}"
                    metadata["correctness_issue"] = message
                    metadata["correctness_issue_name"] = "correctness_issue"
                    verdict.status = "incorrect"
                    verdict.feedback.append(
                        f"Output shape mismatch {label}: expected {expected_shape}, got {got_shape}."
                    )
                    ctx.verify_trial(trials, index)
                    return LoopOutcome(passed, stop=True)
                if not compared.passed:
                    metadata.setdefault("max_difference", []).append(f"{compared.max_diff:.6f}")
                    metadata.setdefault("avg_difference", []).append(f"{compared.avg_diff:.6f}")
                    metadata["correctness_issue"] = "Output mismatch"
                    if compared.detail is not None:
                        mismatches.append(compared.detail)
                else:
                    passed += 1
            except CANDIDATE_ERRORS as exc:
                metadata["runtime_error"] = kb_feedback.kernelbench_truncate(str(exc))
                metadata["runtime_error_name"] = get_error_name(exc)
                metadata["runtime_error_traceback"] = traceback.format_exc()
                poisoned = fail_candidate_exception(verdict, exc, ctx.device, candidate_path, label)
                if not poisoned:
                    ctx.verify_trial(trials, index)
                return LoopOutcome(passed, stop=True, poisoned=poisoned)
            if not ctx.verify_trial(trials, index):
                wrote_inputs.append(index + 1)
    metadata["correctness_trials"] = f"({passed} / {trials})"
    verdict.feedback.extend(kb_feedback.mismatch_sentences(mismatches, trials))
    if wrote_inputs:
        verdict.feedback.append(kb_feedback.inputs_written_note(wrote_inputs))
    return LoopOutcome(passed, stop=False)


def allclose(expected: Any, got: Any, tol: float, rtol: float | None = None) -> bool:
    """KernelBench's comparison, through the function captured before any candidate was imported
    (`tol` is atol, and rtol too unless given)."""
    return bool(_ALLCLOSE(expected, got, atol=tol, rtol=tol if rtol is None else rtol))


def compile_failed(verdict: Verdict, loaded: Any) -> None:
    verdict.status, verdict.compiled = "compile_error", False
    verdict.metadata["compilation_error_name"] = loaded.error_name
    verdict.metadata["compilation_error"] = loaded.error
    verdict.feedback.append(loaded.feedback)


def kernelbench_sticky_result(verdict: Verdict, hardware: str, device: torch.device) -> None:
    """A sticky error in the correctness or timing phase: KernelBench's next device sync raises it
    outside any try, and its batch script records compiled=False with cuda_error metadata."""
    assert verdict.sticky_cause is not None
    verdict.compiled = verdict.correctness = False
    verdict.metadata = kernelbench_cuda_error_metadata(verdict.sticky_cause, hardware, device)


def json_safe_metadata(value: Any) -> Any:
    """KernelBench str()s anything that is not JSON before persisting; do the same."""
    if isinstance(value, dict):
        return {str(k): json_safe_metadata(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe_metadata(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)
