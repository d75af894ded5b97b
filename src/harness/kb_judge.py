"""What a candidate process says of itself, taken in by the worker field by field (kb_drive).

A candidate process reports its own failures (a load that failed, a forward that raised, a shape it
could not deliver), its integrity findings and, in faithful mode, KernelBench's verdict as KernelBench's
loop reached it there. Everything is validated here before it becomes part of a `Verdict`: a status
from the list, booleans as booleans, finite numbers, text clipped, findings of the known shape; anything
else is a `ProtocolError` (the worker fails the candidate, `forbidden_message`). In strict mode only
failures and findings are taken: they can only make the candidate's own result worse. `warn` and `fail`
add the worker's own findings.
"""

from __future__ import annotations

import math
from typing import Any

from kb_channel import ProtocolError
from kb_correctness import Verdict

# Statuses a candidate process may report for itself, and the fields of its verdicts.
STATUSES = ("correct", "incorrect", "compile_error", "runtime_error", "cuda_error", "out_of_memory")
FAILURES = STATUSES[1:]
PHASES = ("load_s", "reference_s", "correctness_s", "timing_s", "ref_timing_s")
STATS = ("mean", "median", "std", "min", "max", "num_trials")
MAX_FEEDBACK = 64 << 10
MAX_FINDINGS = 32


# ------------------------------------------------------------------------------- verdict fragments


def _text_list(value: Any, limit: int) -> list[str]:
    if type(value) is not list:
        raise ProtocolError("feedback that is not a list")
    out: list[str] = []
    total = 0
    for item in value:
        if type(item) is not str:
            raise ProtocolError("feedback that is not text")
        item = item[: MAX_FEEDBACK]
        total += len(item)
        if total > limit:
            break
        out.append(item)
    return out


def findings_of(value: Any) -> list[dict[str, Any]]:
    if value is None:
        return []
    if type(value) is not list:
        raise ProtocolError("findings that are not a list")
    out: list[dict[str, Any]] = []
    for item in value[:MAX_FINDINGS]:
        if type(item) is not dict or type(item.get("category")) is not str or type(item.get("message")) is not str:
            raise ProtocolError("a finding that is not {category, severity, message}")
        severity = item.get("severity")
        if severity not in ("warning", "error"):
            raise ProtocolError("a finding whose severity is not warning or error")
        out.append({"category": item["category"][:64], "severity": severity, "message": item["message"][:4000]})
    return out


def _numbers(value: Any, keys: tuple[str, ...]) -> dict[str, float]:
    if type(value) is not dict:
        raise ProtocolError("numbers that are not an object")
    out: dict[str, float] = {}
    for key in keys:
        if key in value:
            number = value[key]
            if type(number) not in (int, float) or not math.isfinite(number):
                raise ProtocolError(f"{key} that is not a finite number")
            out[key] = number
    return out


def verdict_from_process(wire: Any, full: bool) -> Verdict:
    """A verdict (faithful mode's, `full`) or a failure fragment (strict mode's) the process sent,
    validated field by field; anything malformed is a ProtocolError."""
    if type(wire) is not dict:
        raise ProtocolError("a verdict that is not an object")
    status = wire.get("status")
    if status not in STATUSES:
        raise ProtocolError(f"a verdict with status {status!r}")
    for flag in ("compiled", "correctness", "sticky"):
        if type(wire.get(flag)) is not bool:
            raise ProtocolError(f"a verdict whose {flag} is not a boolean")
    metadata = wire.get("metadata")
    if type(metadata) is not dict or len(repr(metadata)) > MAX_FEEDBACK * 4:
        raise ProtocolError("a verdict whose metadata is not a small object")
    oom = wire.get("oom_request_bytes")
    if oom is not None and type(oom) is not int:
        raise ProtocolError("oom_request_bytes that is not an integer")
    verdict = Verdict(
        status=status,
        compiled=wire["compiled"],
        correctness=wire["correctness"],
        metadata=dict(metadata),
        feedback=_text_list(wire.get("feedback"), MAX_FEEDBACK * 4),
        sticky=wire["sticky"],
        oom_request_bytes=oom,
        findings=findings_of(wire.get("findings")),
    )
    if full:
        stats = _numbers(wire.get("runtime_stats") or {}, STATS)
        verdict.runtime_stats = stats if len(stats) == len(STATS) and stats["mean"] > 0 else {}
        verdict.phases.update(_numbers(wire.get("phases") or {}, PHASES))
        failure = wire.get("reference_failure")
        if failure is not None:
            if type(failure) is not list or len(failure) != 2 or not all(type(n) is int for n in failure):
                raise ProtocolError("a reference_failure that is not [trials, index]")
            verdict.reference_failure = (failure[0], failure[1])
    return verdict


def merge(into: Verdict, fragment: Verdict) -> None:
    """A strict failure fragment from the process into the worker's verdict."""
    into.status, into.compiled, into.correctness = fragment.status, fragment.compiled, False
    into.metadata.update(fragment.metadata)
    into.feedback.extend(fragment.feedback)
    into.sticky = fragment.sticky
    into.oom_request_bytes = fragment.oom_request_bytes
    add_findings(into, fragment.findings)


def add_findings(verdict: Verdict, findings: list[dict[str, Any]]) -> None:
    for finding in findings:
        if finding not in verdict.findings:
            verdict.findings.append(finding)


def warn(verdict: Verdict, category: str, message: str) -> None:
    if any(f["category"] == category for f in verdict.findings):
        return
    verdict.findings.append({"category": category, "severity": "warning", "message": message})
    verdict.feedback.append(f"Warning (integrity): {message}")


def fail(verdict: Verdict, category: str, message: str) -> None:
    verdict.status, verdict.correctness = "incorrect", False
    verdict.runtime_stats = {}
    verdict.metadata["correctness_issue"] = message
    verdict.metadata["correctness_issue_name"] = category
    verdict.findings.append({"category": category, "severity": "error", "message": message})
    verdict.feedback.append(f"Integrity check failed (strict mode): {message}.")
