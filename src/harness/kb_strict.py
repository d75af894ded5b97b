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
that passed, so a result claiming more is refused (kb_eval).

What this does not cover (README, threat model): the timing loop itself (its locals, its clock) still
runs in the candidate's process.
"""

from __future__ import annotations

import random
import secrets
from typing import Any

import torch

import kb_correctness
import kb_inputs
import kb_reference

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
        # (kb_eval holds a result to them: a timed call that failed here fails the candidate).
        self.calls = 0
        self.checked = 0
        self.problems = 0
        # Correctness trials the worker compared and found correct (kb_eval holds a result to it).
        self.trials_passed = 0

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
        return self._fresh.hand_over(fresh)

    def check(self, call: int, output: Any, calls: int) -> str | None:
        """After timed call `call` returned `output`: decide (secret) whether it is checked; if so,
        compare it with the reference's output on the call's pristine inputs. A problem, or None."""
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

    def close(self) -> None:
        self._expected.clear()
        self._pending.clear()
        self._fresh.close()


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
