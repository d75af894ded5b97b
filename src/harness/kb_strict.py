"""Strict timing's inputs and checks, held by the worker and never by the candidate's process.

Every timed call of strict mode sees inputs no call has seen: the worker generates them per call from
a seed derived from a secret (`secrets`, per candidate), on the device where they will be used, outside
the timed region, and hands the candidate a copy in buffers it reuses (so handing them over costs one
device copy, not a new shared allocation per call). It keeps the pristine inputs of the call until the
candidate's output for that call exists; then it decides, from another secret, whether that call is
checked, and if so runs the reference on the pristine inputs and compares, here, in the worker. So:

- no memo keyed on input content can hit (no two timed calls share inputs);
- the candidate cannot learn which calls are checked: the decision is made after its output exists,
  independently for each call (a Bernoulli draw, so knowing earlier decisions says nothing about the
  next), from a generator seeded by a secret that never leaves this process;
- the expected outputs of timed calls and the comparison never enter the candidate's process;
- a re-verification of an excessive speedup (`every=True`) uses new secrets and checks every call;
- inputs are handed out strictly in order, one call at a time (the previous call's output must have come
  back first), so a candidate that asks the worker for later calls' inputs ahead of time, to compute their
  outputs outside the timed region, breaks its own loop instead.

The correctness trials follow the same rule in strict mode: the candidate gets a trial's inputs and only
the shapes and dtypes of its expected output (`trial`), returns its output here, and the comparison
(KernelBench's, kb_correctness.compare_trial) runs here (`compare_trial`), which also counts the trials
that passed, so a result claiming more is refused (kb_pool).

The session also keeps the worker's own clock on the timed calls (`observed_ms`: from handing call i's
inputs over to receiving call i's output), which the candidate's process cannot touch; kb_eval holds a
timed result to it (a reported time implausibly below what the worker saw is refused).

What this does not cover (README, threat model): the timing loop itself (its locals, its clock) still
runs in the candidate's process.
"""

from __future__ import annotations

import random
import secrets
import time
from dataclasses import dataclass
from typing import Any

import torch

import kb_correctness
import kb_inputs
import kb_reference
from kb_correctness import Verdict

# Share of timed calls checked, and the least expected number of checks (so a short CPU run checks most
# calls): a call is checked with probability min(1, max(CHECK_SHARE, MIN_CHECKS / calls)).
CHECK_SHARE = 0.15
MIN_CHECKS = 8


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


class HostTensor:
    """A CPU output on its way to the worker as plain bytes. Sending a CPU tensor itself would pass a
    file descriptor, which starts multiprocessing's fd-serving thread in the candidate's process (a
    thread the integrity check would rightly report); CUDA tensors cross by CUDA IPC and need no thread.
    It pickles as a call of the class on three plain values, the one harness global the worker's
    unpickler resolves for CPU outputs (kb_wire)."""

    __slots__ = ("dtype", "raw", "shape")

    def __init__(self, dtype: str, shape: tuple[int, ...], raw: bytes) -> None:
        self.dtype = dtype
        self.shape = shape
        self.raw = raw

    @classmethod
    def of(cls, tensor: torch.Tensor) -> HostTensor:
        flat = tensor.detach().contiguous().reshape(-1)
        return cls(str(flat.dtype).removeprefix("torch."), tuple(tensor.shape), flat.view(torch.uint8).numpy().tobytes())

    def __reduce__(self) -> tuple[Any, ...]:
        return (HostTensor, (self.dtype, self.shape, self.raw))

    def tensor(self) -> torch.Tensor:
        dtype = getattr(torch, str(self.dtype), None)
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"not a dtype: {self.dtype}")
        shape = tuple(int(n) for n in self.shape)
        if not self.raw:
            return torch.empty(shape, dtype=dtype)
        return torch.frombuffer(bytearray(self.raw), dtype=torch.uint8).view(dtype).reshape(shape)


def to_wire(output: Any) -> Any:
    """`output` as the candidate's process sends it to the worker (CPU tensors as bytes)."""
    if type(output) in (list, tuple):
        return type(output)(to_wire(item) for item in output)
    if type(output) is torch.Tensor and output.device.type == "cpu":
        return HostTensor.of(output)
    return output


def from_wire(value: Any) -> Any:
    if type(value) in (list, tuple):
        return type(value)(from_wire(item) for item in value)
    if type(value) is HostTensor:
        return value.tensor()
    return value


def shapes_only(output: Any) -> Any:
    """`output` with every tensor replaced by a meta tensor of its shape and dtype (no data)."""
    if type(output) in (list, tuple):
        return type(output)(shapes_only(item) for item in output)
    if isinstance(output, torch.Tensor):
        return torch.empty(output.shape, dtype=output.dtype, device="meta")
    return None


def check_probability(calls: int, every: bool) -> float:
    if every or calls <= 0:
        return 1.0
    return min(1.0, max(CHECK_SHARE, MIN_CHECKS / calls))


class StrictOrderError(RuntimeError):
    """Inputs or a check asked out of order: not the strict loop's own sequence of calls."""


class StrictSession:
    """One strict timing run's inputs and checks (module doc). `key` fixes the inputs (the reference's
    own timing uses a key derived from the problem's seed, so its cached time is reproducible); None
    draws a secret one. The check decisions always come from a secret."""

    def __init__(
        self,
        ctx: kb_reference.ProblemContext,
        every: bool = False,
        key: int | None = None,
        tolerance: tuple[float, float] | None = None,
    ) -> None:
        self.ctx = ctx
        # (atol, rtol): eval.tolerance as resolved for the run; KernelBench's per-precision table if None.
        tol = kb_reference.TOLERANCES[ctx.precision]
        self.atol, self.rtol = tolerance if tolerance is not None else (tol, tol)
        self.every = every
        self._fresh = kb_inputs.FreshInputs(ctx, key)
        self._decide = random.Random(secrets.randbits(128))
        self._pending: dict[int, list[Any]] = {}
        self._expected: dict[int, Any] = {}
        self._next = 0
        # Counts for tests and logs: calls handed inputs, calls checked; and checks that found a problem
        # (kb_pool holds a result to them: a timed call that failed here fails the candidate).
        self.calls = 0
        self.checked = 0
        self.problems = 0
        # Correctness trials the worker compared and found correct (kb_pool holds a result to it).
        self.trials_passed = 0
        # The worker's own clock (kb_eval's worker-clock check): when each timed call's inputs were
        # handed over, and per call the span from then to its output coming back (ms), on this side
        # of the pipe, where the candidate's process cannot reach.
        self._handed_at: dict[int, float] = {}
        self.observed_ms: dict[int, float] = {}

    def warmup_inputs(self) -> list[Any]:
        """One input set for the warm-up calls (untimed, unchecked)."""
        return self._fresh.hand_over(self._fresh.make(-1))

    def inputs(self, call: int, keep: bool = True) -> list[Any]:
        """Timed call `call`'s inputs: fresh ones, a copy handed over, the pristine ones kept for the
        check when `keep`. Only the next call's, and only once the previous output has been checked."""
        if call != self._next or self._pending:
            raise StrictOrderError(
                f"inputs of timed call {call + 1} asked out of order (the loop is at call {self._next + 1})"
            )
        self._next += 1
        fresh = self._fresh.make(call)
        self.calls += 1
        if keep:
            self._pending[call] = fresh
        handed = self._fresh.hand_over(fresh)  # synchronised: the inputs are ready from here on
        self._handed_at[call] = _perf_counter()
        return handed

    def check(self, call: int, output: Any, calls: int) -> str | None:
        """After timed call `call` returned `output`: decide (secret) whether it is checked; if so,
        compare it with the reference's output on the call's pristine inputs. A problem, or None."""
        handed = self._handed_at.pop(call, None)
        if handed is not None:
            self.observed_ms[call] = (_perf_counter() - handed) * 1000.0
        problem = self._check(call, output, calls)
        if problem is not None:
            self.problems += 1
        return problem

    def _check(self, call: int, output: Any, calls: int) -> str | None:
        pristine = self._pending.pop(call, None)
        if pristine is None:
            return "no inputs were handed out for this call"
        problem = dense_output_problem(output, self.ctx.device)
        if problem is not None:
            return f"the output is {problem}"
        if self._decide.random() >= check_probability(calls, self.every):
            return None
        self.checked += 1
        expected = self.ctx.reference_output(pristine)
        return compare(output, expected, self.atol, self.rtol)

    def trial(self, trials: int, index: int, seed: int) -> kb_reference.TrialData:
        """Correctness trial `index` as the candidate gets it in strict mode: the inputs and RNG state,
        and in place of the expected output meta tensors of its shapes and dtypes (enough to poison
        freed memory); the expected output stays here for `compare_trial`."""
        data = self.ctx.trial(trials, index, seed)
        self._expected[index] = data.output
        return kb_reference.TrialData(data.inputs, shapes_only(data.output), data.rng)

    def compare_trial(self, index: int, output: Any) -> kb_correctness.TrialComparison:
        """KernelBench's comparison of trial `index`, here, with the expected output only this process
        holds; each trial's output is compared once."""
        expected = self._expected.pop(index, None)
        if expected is None:
            raise StrictOrderError(f"correctness trial {index + 1} was not handed out, or was compared already")
        result = kb_correctness.compare_trial(expected, output, self.atol, self.rtol, index)
        if result.passed:
            self.trials_passed += 1
        return result

    def observed_timed_ms(self, discard: int) -> list[float]:
        """The worker-observed spans of the timed calls a result reports (call `discard` on), in order."""
        return [self.observed_ms[call] for call in sorted(self.observed_ms) if call >= discard]

    def close(self) -> None:
        self._handed_at.clear()
        self._expected.clear()
        self._pending.clear()
        self._fresh.close()


# The worker's clock on strict timed calls (`hold_to_worker_clock`): a timed result whose mean is below
# the mean span the worker observed per timed call minus an allowance is refused. The allowance is
# `factor` times the serving overhead per call measured on the reference's own strict run (the same
# regime, trusted code, so its overhead is what serving costs for this problem here), plus `slack_ms`,
# plus `share` of the observed span (a machine busier during the candidate's run than during the
# reference's stretches the serving with everything else).


@dataclass(frozen=True)
class ClockBound:
    factor: float
    slack_ms: float
    share: float

    def allowance(self, overhead_ms: float, observed_ms: float) -> float:
        return self.factor * overhead_ms + self.slack_ms + self.share * observed_ms


# On the CPU (the candidate's work and the serving share the cores; on a shared CPU the serving was
# seen stretched 4x): loose.
CLOCK_CPU = ClockBound(factor=3.0, slack_ms=1.0, share=0.1)
# On a GPU: in two strict runs of 16 level-1 problems on the H200 (100 honest results, 16 CUDA builds
# running on the host meanwhile) the serving overhead was 0.6-3.1 ms per call and at most 1.39x the
# reference's own, so this bound left every one of them at least 0.7 ms of margin. The CPU bound there
# came to 5.4-12.5 ms, more than the whole span of any kernel under about 5 ms: it refused no time.
CLOCK_CUDA = ClockBound(factor=1.5, slack_ms=0.5, share=0.02)


def clock_bound(regime: dict[str, Any]) -> ClockBound:
    """The bound for a strict regime (`strict_regime`): CLOCK_CUDA where the loop times CUDA events."""
    return CLOCK_CUDA if str(regime.get("clock", "")).startswith("cuda") else CLOCK_CPU


# The observed side is the mean of the shortest spans, the longest CLOCK_TRIM of them left out: a span
# stretched by a moment of the machine's (the process descheduled between its forward and its reply)
# is not the candidate's time, and leaving the longest spans out only ever eases the bound.
CLOCK_TRIM = 0.2


def trimmed_mean(values: list[float]) -> float:
    """The mean of `values` without the longest CLOCK_TRIM of them (at least one value kept)."""
    ordered = sorted(values)
    keep = max(1, len(ordered) - int(len(ordered) * CLOCK_TRIM))
    return sum(ordered[:keep]) / keep


@dataclass
class StrictReference:
    """How strict mode's reference time was taken: `timed_in` "process" (a single-use process served by
    this worker exactly as a candidate is, kb_candidate.time_reference_job) or "worker: <why>" (the
    fallback, the worker's own native loop); the regime (`strict_regime`) and the worker's
    serving overhead per timed call in ms (observed span minus reported time; None in the worker)."""

    timed_in: str
    regime: dict[str, Any]
    overhead_ms: float | None


def strict_regime(ref: Any, timing: dict[str, Any]) -> dict[str, Any]:
    """What kb_candidate.strict_times times under for `ref` (a ProblemContext or a RemoteReference) and
    the job's `timing`: recorded by the worker for the candidate and for the reference, side by side."""
    cuda = ref.device.type == "cuda"
    return {
        "loop": "native",
        "process": "single-use",
        "inputs": "fresh per call, from the worker",
        "outputs": "each handed to the worker's check",
        "clock": "cuda_events, device-wide fence" if cuda else "steady_clock",
        "l2_flush": bool(cuda and timing["l2_flush"]),
        "warmup": int(timing["warmup"]),
        "calls": int(timing["trials"]) + int(timing["discard_first"]),
        "discard_first": int(timing["discard_first"]),
    }


def hold_to_worker_clock(verdict: Verdict, strict_ref: StrictReference | None) -> None:
    """Strict mode: a timed result stands only if its reported mean is not implausibly below what the
    worker's own clock saw. The worker times each timed call from handing its inputs over to receiving
    its output (StrictSession.observed_ms); the call's real work happens inside that span
    (inputs exist only from its start, the output must exist at its end), so an honest time never
    exceeds it and a replacement that computes every output but reports less than it took is bounded
    by it. The span also holds the serving (the pipe, the hand-overs, the fences, the L2 flush): the
    allowance is a ClockBound (`clock_bound` of the reference's regime: tighter on a GPU than on the
    CPU) of that overhead as measured on the reference's strict run (the same regime, trusted code) and
    of the observed span, compared on means (what the speedup uses; the observed side without its longest spans, CLOCK_TRIM), so
    an honest candidate passes even where serving dominates (tiny kernels), and what a forged result
    can shave off its real time is bounded by the allowance. Without a calibration (a reference time
    given by the request, or timed in the worker) the figures are recorded, not held to."""
    clock = verdict.metadata.get("worker_clock")
    stats = verdict.runtime_stats
    if not clock or not stats or verdict.status != "correct" or clock.get("observed_trimmed_ms") is None:
        return
    if strict_ref is None or strict_ref.overhead_ms is None:
        clock["allowance_ms"] = None
        return
    observed, reported = float(clock["observed_trimmed_ms"]), float(stats["mean"])
    allowance = clock_bound(strict_ref.regime).allowance(strict_ref.overhead_ms, observed)
    clock["allowance_ms"] = allowance
    if reported >= observed - allowance:
        return
    message = (
        f"the candidate's process reported a mean of {reported:.4f} ms per timed call, but the worker's own "
        f"clock saw {observed:.4f} ms per call (the mean of its shortest spans) from handing the inputs over "
        f"to receiving the output (serving allows at most {allowance:.4f} ms of that)"
    )
    refuse_forged(verdict, message)


def refuse_forged(verdict: Verdict, message: str) -> None:
    """Strict mode: a result the harness's own loop and checks did not produce is incorrect, untimed."""
    verdict.status, verdict.correctness = "incorrect", False
    verdict.runtime_stats = {}
    verdict.metadata["correctness_issue"] = message
    verdict.metadata["correctness_issue_name"] = "forged_result"
    verdict.findings.append({"category": "forged_result", "severity": "error", "message": message})
    verdict.feedback.append(f"Integrity check failed (strict mode): {message}.")


def compare(output: Any, expected: Any, atol: float, rtol: float) -> str | None:
    if isinstance(expected, (list, tuple)):
        if not isinstance(output, (list, tuple)) or len(output) != len(expected):
            return "the output's structure differs from the reference's"
        for got, want in zip(output, expected, strict=True):
            problem = compare(got, want, atol, rtol)
            if problem is not None:
                return problem
        return None
    if not isinstance(expected, torch.Tensor) or not isinstance(output, torch.Tensor):
        return "the output is not a tensor"
    if output.shape != expected.shape:
        return f"output shape {tuple(output.shape)}, expected {tuple(expected.shape)}"
    if not bool(_ALLCLOSE(expected, output, atol=atol, rtol=rtol)):
        return "the output does not match the reference for this call's inputs"
    return None


# Captured when the worker imports this module; no candidate code runs in the worker.
_ALLCLOSE = torch.allclose
_perf_counter = time.perf_counter
