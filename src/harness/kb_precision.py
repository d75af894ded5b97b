"""Precision: is a candidate's output as accurate as the reference's own, judged against float64?

A candidate can lower precision from C++ (TF32 switched on and back off inside its call, operands packed
to fp16 with fp32 accumulation) and still pass KernelBench's atol = rtol = 1e-4 on its inputs, which are
positive, so sums do not cancel and rounding errors average out. The check here does not read settings
(a candidate owns its process and can restore them); it measures the output:

- per problem, once (`probe_for`): inputs from a seed of the worker's, made signed (every floating input
  multiplied by random signs, so sums cancel and a lowered precision shows), the reference's output on
  them (`expected`, in the run's precision) and the same reference run in float64; `e_ref`, the relative
  L2 error of the reference's own output against float64, is what the run's precision costs here. When
  signed inputs make the reference non-finite or meaningless (logarithms, probabilities), KernelBench's
  own distribution is used instead; when neither works (no floating input or output, a float64 forward
  that fails, inputs over `MAX_PROBE_BYTES`), the probe is not applicable and says why;
- per candidate (kb_drive): calls on the probe's inputs, the outputs copied back; `ratio` is the
  relative L2 distance from the reference's output over `e_ref` (floored at the output dtype's epsilon).
  An honest kernel that only reorders its sums stays near 1 (split-K, trees; a plain sequential loop
  over 16k terms measured under 15 on the CPU); TF32 or fp16 operands come out at 228 on the H200 for
  KernelBench's 4096 matmul against cuBLAS's float32 (docs/benchmarks.md), and higher for shorter sums
  (the operands' rounding stays, the reference's own error shrinks).

`WARN_RATIO` warns (`precision_lowered`, both modes); `FAIL_RATIO` fails the candidate in strict mode. It
sits between the two: a TF32 matmul's ratio falls as its sums grow (about 8192 / sqrt(K)), a sequential
float32 loop's grows, and they meet only for sums far longer than a KernelBench matmul's.
A run whose contract is lower precision (eval.precision fp16/bf16) keeps its meaning: the reference
runs in that precision too, so its own error is the yardstick.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

import torch

import kb_reference
from kb_feedback import CANDIDATE_ERRORS
from kb_tensors import nbytes

WARN_RATIO = 16.0
FAIL_RATIO = 64.0
# Inputs and the reference's parameters larger than this are not probed (the float64 copies and the
# float64 forward would take several times as much device memory).
MAX_PROBE_BYTES = 2 << 30
# A reference whose own error against float64 is above this is not a yardstick (chaotic or discrete).
E_REF_MAX = 1e-2
# The probe's inputs come from the problem's seed plus this offset (never a trial's or timing's inputs).
PROBE_SEED_OFFSET = 2_000_029


@dataclass
class Probe:
    """One problem's precision probe (module doc); `why` says why it is not applicable (then the rest
    is empty)."""

    inputs: list[Any] | None = None
    expected: Any = None
    e_ref: float = 0.0
    kind: str = ""
    why: str | None = None
    # Made from the orchestrator's summary of an earlier run (kb_reference.ProbeHint): no float64
    # forward ran here.
    from_hint: bool = False

    def summary(self) -> dict[str, Any]:
        if self.why is not None:
            return {"checked": False, "why": self.why}
        return {"checked": True, "inputs": self.kind, "reference_error": self.e_ref}

    def wire(self) -> dict[str, Any]:
        """What the orchestrator keeps for the next run (kb_protocol.ProbeSummary)."""
        if self.why is not None:
            return {"why": self.why}
        return {"kind": self.kind, "e_ref": self.e_ref}


def _floating(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value] if value.is_floating_point() else []
    if type(value) in (list, tuple):
        return [t for v in value for t in _floating(v)]
    return []


def _signed(value: Any, seed: int) -> Any:
    """`value` with every floating tensor's elements multiplied by random signs, drawn on its own device
    from `seed` (on a GPU, a gigabyte input's signs take milliseconds, not the seconds of the CPU's
    int64 draw and copy)."""
    generators: dict[torch.device, torch.Generator] = {}

    def signed(v: Any) -> Any:
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            generator = generators.get(v.device)
            if generator is None:
                generator = generators[v.device] = torch.Generator(device=v.device).manual_seed(seed)
            signs = torch.randint(0, 2, v.shape, generator=generator, device=v.device, dtype=torch.uint8)
            return v * (signs.to(v.dtype) * 2 - 1)
        if type(v) in (list, tuple):
            return type(v)(signed(x) for x in v)
        return v

    return signed(value)


def _to_double(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.to(torch.float64)
    if type(value) in (list, tuple):
        return type(value)(_to_double(v) for v in value)
    return value


def relative_error(got: Any, truth: Any) -> float:
    """Relative L2 distance of `got` from `truth` (all floating leaves together), in float64."""
    num = den = 0.0
    for a, b in zip(_floating(got), _floating(truth), strict=True):
        a64, b64 = a.detach().to(torch.float64), b.detach().to(torch.float64)
        num += float(torch.sum((a64 - b64) ** 2).item())
        den += float(torch.sum(b64**2).item())
    if den == 0.0:
        return 0.0 if num == 0.0 else math.inf
    return math.sqrt(num / den)


def _finite(value: Any) -> bool:
    return all(bool(torch.isfinite(t).all().item()) for t in _floating(value))


def probe_for(ctx: kb_reference.ProblemContext) -> Probe:
    """The problem's probe, made once and kept on the context."""
    cached = getattr(ctx, "precision_probe", None)
    if isinstance(cached, Probe):
        return cached
    probe = _make_probe(ctx)
    ctx.precision_probe = probe  # type: ignore[attr-defined]
    return probe


def _make_probe(ctx: kb_reference.ProblemContext) -> Probe:
    if ctx.ref_model is None:
        return Probe(why="the reference did not load")
    try:
        inputs = ctx.fresh_inputs(ctx.seed + PROBE_SEED_OFFSET)
    except CANDIDATE_ERRORS as exc:
        return Probe(why=f"get_inputs failed: {type(exc).__name__}")
    if not _floating(inputs):
        return Probe(why="no floating-point inputs")
    params = sum(p.numel() * p.element_size() for p in ctx.ref_model.parameters())
    if nbytes(inputs) + params > MAX_PROBE_BYTES:
        return Probe(why=f"inputs and parameters over {MAX_PROBE_BYTES >> 30} GiB")
    seed = ctx.seed + PROBE_SEED_OFFSET
    hinted = _from_hint(ctx, inputs, seed)
    if hinted is not None:
        return hinted
    try:
        model64 = copy.deepcopy(ctx.ref_model).to(torch.float64)
    except CANDIDATE_ERRORS as exc:
        return Probe(why=f"the reference does not convert to float64: {type(exc).__name__}")
    why = "the reference's output is not finite on the probe's inputs"
    try:
        for kind, candidate_inputs in (("signed", _signed(inputs, seed)), ("kernelbench", inputs)):
            expected = ctx.reference_output(candidate_inputs)
            if not _floating(expected):
                return Probe(why="no floating-point output")
            try:
                with torch.no_grad():
                    truth = model64(*_to_double(candidate_inputs))
            except CANDIDATE_ERRORS as exc:
                return Probe(why=f"the reference's float64 forward failed: {type(exc).__name__}")
            if len(_floating(truth)) != len(_floating(expected)) or not (_finite(truth) and _finite(expected)):
                continue
            e_ref = relative_error(expected, truth)
            if e_ref > E_REF_MAX:
                why = f"the reference's own error against float64 is {e_ref:.1e} (not a yardstick)"
                continue
            return Probe(inputs=candidate_inputs, expected=expected, e_ref=e_ref, kind=kind)
    finally:
        del model64
    return Probe(why=why)


def _from_hint(ctx: kb_reference.ProblemContext, inputs: list[Any], seed: int) -> Probe | None:
    """The probe from an earlier run's summary (kb_reference.ProbeHint): the same inputs and the
    reference's output on them, its float64 error as the summary says. None (the probe is made in
    full) without a usable summary, or when the output is not what the summary was made from."""
    hint = ctx.probe_hint
    if hint is None:
        return None
    if hint.why is not None:
        return Probe(why=hint.why, from_hint=True)
    if hint.kind not in ("signed", "kernelbench") or not (0.0 <= hint.e_ref <= E_REF_MAX):
        return None
    probe_inputs = _signed(inputs, seed) if hint.kind == "signed" else inputs
    expected = ctx.reference_output(probe_inputs)
    if not _floating(expected) or not _finite(expected):
        return None
    return Probe(inputs=probe_inputs, expected=expected, e_ref=hint.e_ref, kind=hint.kind, from_hint=True)


def floor(expected: Any) -> float:
    """The smallest error that counts: the output dtype's epsilon."""
    leaves = _floating(expected)
    return float(torch.finfo(leaves[0].dtype).eps) if leaves else float(torch.finfo(torch.float32).eps)


def ratio(probe: Probe, got: Any) -> float:
    """The candidate's distance from the reference's output over the reference's own error (module doc)."""
    return relative_error(got, probe.expected) / max(probe.e_ref, floor(probe.expected))
