"""Strict mode times the reference as it times a candidate: in a single-use process driven by the worker,
on the worker's clock (issue 35). A reference that cannot be timed so stays untimed rather than timed in
another regime. Real worker and candidate processes on the CPU; no test compares durations."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import kb_eval
import kb_protocol
import kb_reference
from harness_client import FIXTURES, evaluate_request

MATMUL = (FIXTURES / "integrity" / "problem_matmul.py").read_text()
HONEST = (FIXTURES / "integrity" / "honest.py").read_text()


@pytest.fixture(scope="module")
def worker() -> Iterator[kb_eval.Worker]:
    isolated = kb_eval.Worker(isolate=True)
    yield isolated
    isolated.close()


def evaluate(worker: kb_eval.Worker, problem: str, source: str, build: Path, mode: str = "strict") -> dict[str, Any]:
    request = evaluate_request(2, problem, source, build, mode=mode, timing_trials=10)
    response = kb_eval.evaluate(request, worker)
    assert kb_protocol.check_response(response) == []
    return response


# A reference whose forward ends the process it runs in when that is a candidate process: its strict
# timing process dies (the worker, which builds its trials, never sees it happen).
DYING = MATMUL.replace(
    "        return torch.matmul(A, B)",
    "        import multiprocessing, os\n"
    "        if multiprocessing.current_process().name == 'krefine-candidate':\n"
    "            os._exit(3)\n"
    "        return torch.matmul(A, B)",
)


@pytest.mark.slow
def test_a_reference_timing_process_that_dies_leaves_the_reference_untimed(
    worker: kb_eval.Worker, tmp_path: Path
) -> None:
    """Not a candidate's death to report: the worker lives on, the candidate keeps its verdict, and no
    speedup is given (a reference timed in another regime would bias it)."""
    assert DYING != MATMUL
    response = evaluate(worker, DYING, HONEST, tmp_path / "dying")
    assert response["status"] == "correct" and response["speedup"] is None, response
    assert "The reference could not be timed" in response["feedback"], response["feedback"]
    assert "exit code 3" in response["feedback"]
    # The worker is fine: the next problem's candidate is timed against its reference.
    after = evaluate(worker, MATMUL, HONEST, tmp_path / "after")
    assert after["status"] == "correct" and after["speedup"] is not None, after


@pytest.mark.slow
def test_the_reference_job_checks_every_call_when_asked(worker: kb_eval.Worker) -> None:
    request = evaluate_request(1, MATMUL, "", Path("."), mode="strict", timing_trials=6)
    ctx = worker.references.context(kb_reference.ReferenceSpec.of(request))
    before = ctx.counts["strict_checks"]
    stats, regime = kb_eval.time_strict_reference(request, worker, ctx, 7, every=True)
    assert stats["num_trials"] == 6
    assert regime["check_share"] == 1.0 and regime["checked"] == 7
    # every=True: the worker compared each of the 7 timed calls with the reference's output (plus one
    # forward for the output's layout).
    assert ctx.counts["strict_checks"] - before in (7, 8)
