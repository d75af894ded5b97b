"""Strict mode times the reference as it times a candidate (issue 23: the honest control within the band),
and holds a timed result to the worker's own clock (issue 23: a replacement that drives the worker's
calls and computes every output cannot report a time it did not take). Real worker and candidate
processes on the CPU; no test compares durations."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import kb_eval
import kb_protocol
import kb_reference
import kb_strict
from harness_client import FIXTURES, evaluate_request

MATMUL = (FIXTURES / "integrity" / "problem_matmul.py").read_text()
CHAIN = (FIXTURES / "integrity" / "problem_chain.py").read_text()
HONEST = (FIXTURES / "integrity" / "honest.py").read_text()
# The reference's own code under the candidate's name: identical work on both sides.
IDENTICAL = MATMUL.replace("class Model(nn.Module)", "class ModelNew(nn.Module)").replace(
    "super(Model, self)", "super(ModelNew, self)"
)


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


@pytest.mark.slow
def test_the_reference_is_timed_in_the_candidates_regime(worker: kb_eval.Worker, tmp_path: Path) -> None:
    """The reference's strict time comes from a single-use process served by the worker exactly as the
    candidate's (kb_candidate.strict_times): the result records both regimes, and they are the same."""
    for name, source in (("identical", IDENTICAL), ("honest", HONEST)):
        response = evaluate(worker, MATMUL, source, tmp_path / name)
        assert response["status"] == "correct" and response["speedup"] is not None, response
        regimes = response["metadata"]["strict_timing"]
        assert regimes["reference_timed_in"] == "process", regimes
        assert regimes["candidate"] == regimes["reference"], regimes
        assert regimes["candidate"] == {
            "loop": "native",
            "process": "single-use",
            "inputs": "fresh per call, from the worker",
            "outputs": "each handed to the worker's check",
            "clock": "steady_clock",
            "l2_flush": False,
            "warmup": 3,
            "calls": 11,
            "discard_first": 1,
        }
        clock = response["metadata"]["worker_clock"]
        assert clock["observed_calls"] == 10 and clock["allowance_ms"] is not None, clock
        # The candidate's reported time is inside the worker's spans (causality, not a duration test).
        assert clock["reported_mean_ms"] <= clock["observed_mean_ms"], clock
    # Faithful mode keeps KernelBench's loop in the worker for the reference: nothing of this recorded.
    faithful = evaluate(worker, MATMUL, IDENTICAL, tmp_path / "faithful", mode="faithful")
    assert faithful["status"] == "correct"
    assert "strict_timing" not in faithful["metadata"] and "worker_clock" not in faithful["metadata"]


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
def test_a_reference_timing_process_that_dies_leaves_the_worker_to_time_it(
    worker: kb_eval.Worker, tmp_path: Path
) -> None:
    """Not a candidate's death to report: the worker lives on, times the reference in its own loop, says
    so in the result, and holds nothing to a clock it could not calibrate."""
    assert DYING != MATMUL
    response = evaluate(worker, DYING, HONEST, tmp_path / "dying")
    assert response["status"] == "correct" and response["speedup"] is not None, response
    where = response["metadata"]["strict_timing"]["reference_timed_in"]
    assert where.startswith("worker: the reference's timing process ended without a result"), where
    assert "exit code 3" in where
    assert response["metadata"]["worker_clock"]["allowance_ms"] is None


def test_the_reference_job_runs_the_candidates_loop_in_the_session() -> None:
    """In one process (the harness's unit-test mode): the reference job is served by a strict session
    like a candidate's: every timed call's inputs handed out by it, its output back to it, its spans on
    the worker's clock."""
    worker = kb_eval.Worker(isolate=False)
    request = evaluate_request(1, MATMUL, "", Path("."), mode="strict", timing_trials=6)
    ctx = worker.references.context(kb_reference.ReferenceSpec.of(request))
    stats, strict_ref = kb_eval.time_strict_reference(request, worker, ctx, 7, every=True)
    assert stats["num_trials"] == 6
    assert strict_ref.timed_in == "in_worker" and strict_ref.overhead_ms is not None
    assert strict_ref.regime == kb_strict.strict_regime(ctx, request["timing"])
    # every=True: the worker compared each of the 7 timed calls with the reference's output.
    assert ctx.counts["strict_checks"] == 7


@pytest.mark.slow
def test_the_worker_clock_refuses_a_rewritten_time(worker: kb_eval.Worker, tmp_path: Path) -> None:
    """clock_forger computes every output (every secret check passes, the worker served every call it
    reports) and rewrites the harness's packing of its times to report a tenth of them; the worker's
    own spans on those calls refuse it. The honest control on the same problem stands."""
    honest = evaluate(worker, CHAIN, (FIXTURES / "strict" / "chain_honest.py").read_text(), tmp_path / "h")
    assert honest["status"] == "correct" and honest["speedup"] is not None, honest
    assert honest["metadata"]["worker_clock"]["allowance_ms"] is not None
    forged = evaluate(worker, CHAIN, (FIXTURES / "strict" / "clock_forger.py").read_text(), tmp_path / "f")
    assert forged["status"] == "incorrect" and forged["speedup"] is None, forged
    assert forged["metadata"]["correctness_issue_name"] == "forged_result", forged
    assert "worker's own clock" in forged["metadata"]["correctness_issue"]
    assert [f["category"] for f in forged["findings"]] == ["forged_result"]
    # Faithful mode takes the candidate's process's word for its time, as KernelBench does.
    faithful = evaluate(worker, CHAIN, (FIXTURES / "strict" / "clock_forger.py").read_text(), tmp_path / "ff", "faithful")
    assert faithful["status"] == "correct" and faithful["speedup"] is not None


def _held(reported: float, observed: float, ref: kb_strict.StrictReference | None) -> kb_eval.Verdict:
    """hold_to_worker_clock on fixed figures (ms): nothing is timed in these tests, the bound's
    arithmetic is asserted exactly."""
    verdict = kb_eval.Verdict(status="correct", correctness=True)
    verdict.runtime_stats = {"mean": reported, "num_trials": 10}
    verdict.metadata["worker_clock"] = {
        "observed_mean_ms": observed,
        "observed_trimmed_ms": observed,
        "observed_calls": 10,
        "reported_mean_ms": reported,
    }
    kb_strict.hold_to_worker_clock(verdict, ref)
    return verdict


CUDA_REGIME = {"clock": "cuda_events, device-wide fence"}


def test_the_clock_bound_holds_honest_times_and_refuses_forged_ones() -> None:
    """hold_to_worker_clock's arithmetic on the CPU: reported >= observed - (3 x overhead + 1 ms + a tenth
    of observed) stands; below it is forged; without a calibration the figures are recorded and nothing
    is held."""
    reference = kb_strict.StrictReference("process", {"clock": "steady_clock"}, 0.5)
    assert kb_strict.clock_bound(reference.regime) == kb_strict.CLOCK_CPU == kb_strict.ClockBound(3.0, 1.0, 0.1)
    fixed = 3.0 * 0.5 + 1.0
    tiny = _held(0.001, fixed, reference)  # serving dominates: an honest tiny kernel
    assert tiny.status == "correct"
    assert tiny.metadata["worker_clock"]["allowance_ms"] == fixed + 0.1 * fixed
    allowance = fixed + 0.1 * 10.0
    edge = _held(10.0 - allowance, 10.0, reference)
    assert edge.status == "correct"
    assert _held(10.0 - allowance - 0.01, 10.0, reference).status == "incorrect"
    forged = _held(1.0, 10.0, reference)
    assert forged.status == "incorrect" and forged.runtime_stats == {}
    assert forged.metadata["correctness_issue_name"] == "forged_result"
    uncalibrated = _held(1.0, 10.0, None)
    assert uncalibrated.status == "correct" and uncalibrated.metadata["worker_clock"]["allowance_ms"] is None


# Honest strict results on the H200 (two strict `krefine bench throughput` runs of 16 level-1 problems,
# 16 CUDA builds running meanwhile; docs/benchmarks.md, fifth session): (problem/sample, observed trimmed
# span, reported mean, the reference's serving overhead), all ms. The closest to the GPU bound of 100.
H200_HONEST = [
    ("1/54/1", 3.8647, 2.4289, 1.0363),
    ("1/54/2", 3.9463, 2.6476, 1.0363),
    ("1/77/2", 6.9857, 5.6164, 1.1273),
    ("1/17/1", 4.4933, 2.7734, 1.4927),
    ("1/54/1", 3.7648, 2.4217, 1.3551),
    ("1/49/1", 4.5660, 2.7794, 1.6450),
    ("1/86/2", 8.5268, 6.6134, 1.7650),
    ("1/93/2", 14.3664, 11.3036, 2.8495),
    ("1/64/1", 21.4430, 18.9673, 2.3288),
]


def test_on_a_gpu_the_clock_bound_is_tight_enough_to_refuse_a_forged_matmul() -> None:
    """On a GPU the bound is 1.5 x overhead + 0.5 ms + 2 % of observed. With the CPU's bound, a 4096
    matmul observed at 4.22 ms per call with 1.60 ms of serving overhead had an allowance of 6.23 ms, more
    than its span: any reported time stood. Now it is 2.98 ms, so a time under 1.24 ms is refused."""
    reference = kb_strict.StrictReference("process", CUDA_REGIME, 1.6)
    assert kb_strict.clock_bound(CUDA_REGIME) == kb_strict.CLOCK_CUDA == kb_strict.ClockBound(1.5, 0.5, 0.02)
    allowance = 1.5 * 1.6 + 0.5 + 0.02 * 4.22
    assert kb_strict.CLOCK_CPU.allowance(1.6, 4.22) > 4.22  # the CPU's bound would refuse nothing
    honest = _held(2.79, 4.22, reference)
    assert honest.status == "correct"
    assert honest.metadata["worker_clock"]["allowance_ms"] == allowance
    assert _held(4.22 - allowance, 4.22, reference).status == "correct"
    forged = _held(1.0, 4.22, reference)  # a forged x2.8
    assert forged.status == "incorrect" and forged.metadata["correctness_issue_name"] == "forged_result"


@pytest.mark.parametrize(("key", "observed", "reported", "overhead"), H200_HONEST)
def test_every_honest_h200_result_stands_under_the_gpu_bound(
    key: str, observed: float, reported: float, overhead: float
) -> None:
    verdict = _held(reported, observed, kb_strict.StrictReference("process", CUDA_REGIME, overhead))
    assert verdict.status == "correct", key
    # With at least 0.7 ms to spare (the closest of the 100 had 0.70 ms).
    assert reported - (observed - verdict.metadata["worker_clock"]["allowance_ms"]) >= 0.69, key


def test_the_observed_side_leaves_out_the_longest_spans() -> None:
    """A span stretched by the machine (a descheduled process) only eases the bound: the longest fifth of
    the spans is left out of the observed mean, never more than all but one."""
    assert kb_strict.trimmed_mean([10.0, 10.0, 10.0, 10.0, 60.0]) == 10.0
    assert kb_strict.trimmed_mean([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 100.0]) == 4.5
    assert kb_strict.trimmed_mean([3.0, 1.0]) == 2.0
    assert kb_strict.trimmed_mean([7.0]) == 7.0
