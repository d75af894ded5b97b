"""Strict timing's secrets, held by the worker and never by the candidate's process.

Every timed call of strict mode sees inputs no call has seen: the worker generates them per call from a
seed derived from a secret (`secrets`, per candidate), on the device, in its own memory, before the call's
span opens; they reach the candidate only as a copy the worker writes into the lent input buffers after
its clock has started (kb_drive). After the output is back in the worker's memory, the worker decides,
from another secret, whether that call is checked, and if so runs the reference on the pristine inputs
and compares, here, in the worker. So:

- no memo keyed on input content can hit (no two timed calls share inputs);
- the candidate cannot learn which calls are checked: the decision is made after its output exists,
  independently for each call (a Bernoulli draw, so knowing earlier decisions says nothing about the
  next), from a generator seeded by a secret that never leaves this process;
- the expected outputs and the comparison never enter the candidate's process;
- a re-verification of an excessive speedup (`every=True`) uses new secrets and checks every call.

Half the timed calls are checked (at least `MIN_CHECKS`): a candidate that skips the work of k calls
passes with probability 2^-k, so skipping enough to gain 5 % of 101 calls passes one time in 32.
"""

from __future__ import annotations

import random
import secrets
from typing import Any

import torch

import kb_inputs
import kb_reference
from kb_correctness import Verdict, sliced_allclose

# Share of timed calls checked, and the least expected number of checks (so a short CPU run checks most
# calls): a call is checked with probability min(1, max(CHECK_SHARE, MIN_CHECKS / calls)).
CHECK_SHARE = 0.5
MIN_CHECKS = 8


def check_probability(calls: int, every: bool) -> float:
    if every or calls <= 0:
        return 1.0
    return min(1.0, max(CHECK_SHARE, MIN_CHECKS / calls))


class StrictSession:
    """One strict timing run's inputs and check decisions (module doc). `key` fixes the inputs (the
    reference's own timing uses a key derived from the problem's seed, so its cached time is
    reproducible); None draws a secret one. The check decisions always come from a secret."""

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
        # Counts for tests, logs and the result: calls made, calls checked, checks that failed.
        self.calls = 0
        self.checked = 0
        self.problems = 0

    def make(self, call: int) -> list[Any]:
        """Call `call`'s pristine inputs (-1: the warm-up set), in the worker's memory."""
        if call >= 0:
            self.calls += 1
        return self._fresh.make(call)

    def check(self, inputs: list[Any], output: Any, calls: int) -> str | None:
        """After a timed call returned `output` (a private copy) for `inputs`: decide (secret) whether it
        is checked; if so, compare it with the reference's output on the call's pristine inputs. A
        problem, or None."""
        if self._decide.random() >= check_probability(calls, self.every):
            return None
        self.checked += 1
        expected = self.ctx.reference_output(inputs)
        problem = compare(output, expected, self.atol, self.rtol)
        if problem is not None:
            self.problems += 1
        return problem

    def close(self) -> None:
        self._fresh.close()


def regime(ctx: Any, timing: dict[str, Any], every: bool) -> dict[str, Any]:
    """What strict timing times under (kb_drive), recorded for the candidate and the reference alike."""
    cuda = ctx.device.type == "cuda"
    calls = int(timing["trials"]) + int(timing["discard_first"])
    return {
        "clock": "worker perf_counter: inputs written -> output copied back",
        "process": "single-use",
        "inputs": "fresh per call, written by the worker inside the span",
        "outputs": "copied by the worker, checked in the worker",
        "check_share": check_probability(calls, every),
        "l2_flush": bool(cuda and timing["l2_flush"]),
        "warmup": int(timing["warmup"]),
        "calls": calls,
        "discard_first": int(timing["discard_first"]),
    }


def refuse_forged(verdict: Verdict, message: str) -> None:
    """Strict mode: a result the harness's own checks did not produce is incorrect, untimed."""
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
    if output.dtype != expected.dtype:
        return f"output dtype {output.dtype}, expected {expected.dtype}"
    if not sliced_allclose(expected, output, atol, rtol):
        return "the output does not match the reference for this call's inputs"
    return None

