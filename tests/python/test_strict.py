"""Strict mode (issue 35): the worker times each call on its own clock and judges what it copied back; the
candidate's process only computes. Unit tests of the secrets (kb_strict) on a real reference context, then
real worker-side jobs (kb_eval.Worker in this process, every candidate in a process of its own) on the
CPU. Verdicts, counts and causal floors only (a candidate that sleeps 25 ms per call cannot be timed
under 25 ms), never a comparison of durations."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import kb_eval
import kb_precision
import kb_prepare
import kb_protocol
import kb_reference
import kb_strict
from harness_client import FIXTURES, evaluate_request, prepare_request

PROBLEM = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x, y):
        return x * 2 + y


def get_inputs():
    return [torch.rand(64), torch.rand(64)]


def get_init_inputs():
    return []
"""


@pytest.fixture()
def ctx() -> kb_reference.ProblemContext:
    cache = kb_reference.ReferenceCache()
    context = cache.context(kb_reference.ReferenceSpec(PROBLEM, torch.device("cpu"), "fp32", "strict", 42))
    assert context.error is None
    return context


def test_every_call_gets_inputs_no_call_has_seen(ctx: kb_reference.ProblemContext) -> None:
    session = kb_strict.StrictSession(ctx)
    sets = [session.make(n) for n in range(-1, 20)]
    keys = {b"".join(t.numpy().tobytes() for t in inputs) for inputs in sets}
    assert len(keys) == len(sets)  # the warm-up set and 20 calls, all different
    assert session.calls == 20


def test_inputs_follow_the_key_and_secret_keys_differ(ctx: kb_reference.ProblemContext) -> None:
    a, b = kb_strict.StrictSession(ctx, key=5).make(0), kb_strict.StrictSession(ctx, key=5).make(0)
    c, d = kb_strict.StrictSession(ctx).make(0), kb_strict.StrictSession(ctx).make(0)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not torch.equal(c[0], d[0])


def test_half_the_calls_are_checked_each_decided_on_its_own(ctx: kb_reference.ProblemContext) -> None:
    assert kb_strict.check_probability(101, every=False) == kb_strict.CHECK_SHARE == 0.5
    assert kb_strict.check_probability(11, every=False) == pytest.approx(8 / 11)
    assert kb_strict.check_probability(5, every=False) == 1.0
    assert kb_strict.check_probability(101, every=True) == 1.0
    session = kb_strict.StrictSession(ctx)
    session._decide = random.Random(3)  # a fixed draw for a reproducible count; a secret one in the worker
    inputs = session.make(0)
    right = inputs[0] * 2 + inputs[1]
    for _ in range(101):
        assert session.check(inputs, right, 101) is None
    assert 30 < session.checked < 71
    every = kb_strict.StrictSession(ctx, every=True)
    for _ in range(7):
        every.check(inputs, right, 7)
    assert every.checked == 7


def test_a_wrong_output_fails_a_checked_call(ctx: kb_reference.ProblemContext) -> None:
    session = kb_strict.StrictSession(ctx, every=True)
    inputs = session.make(0)
    problem = session.check(inputs, torch.zeros(64), 1)
    assert problem is not None and "does not match" in problem
    assert session.check(inputs, torch.zeros(3), 1) == "output shape (3,), expected (64,)"
    assert session.check(inputs, (inputs[0] * 2 + inputs[1]).double(), 1) == (
        "output dtype torch.float64, expected torch.float32"
    )
    assert session.problems == 3


# ------------------------------------------------------------------ real candidate processes, CPU

MATMUL = (FIXTURES / "integrity" / "problem_matmul.py").read_text()
HONEST = (FIXTURES / "integrity" / "honest.py").read_text()


@pytest.fixture(scope="module")
def worker() -> Iterator[kb_eval.Worker]:
    isolated = kb_eval.Worker(isolate=True)
    assert kb_prepare.prepare(prepare_request(1, MATMUL), isolated)["status"] == "ready"
    yield isolated
    isolated.close()


def source_of(name: str) -> str:
    return HONEST if name == "honest" else (FIXTURES / "strict" / name).read_text()


def evaluate(
    worker: kb_eval.Worker, root: Path, name: str, mode: str, measure: bool = True, trials: int = 10
) -> dict[str, Any]:
    request = evaluate_request(2, MATMUL, source_of(name), root / name, mode=mode, measure=measure, timing_trials=trials)
    response = kb_eval.evaluate(request, worker)
    assert kb_protocol.check_response(response) == []
    return response


def categories(response: dict[str, Any]) -> list[str]:
    return [f["category"] for f in response["findings"]]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["strict", "faithful"])
def test_trials_compare_where_the_expected_outputs_are(worker: kb_eval.Worker, tmp_path: Path, mode: str) -> None:
    """Strict: the candidate's process never holds a trial's expected output nor runs its comparison, so
    stealing it (gc_stealer) or patching every comparison there (compare_patcher, trial_patcher) fails
    the trials themselves. Faithful keeps KernelBench's in-process comparison: all three pass it (the
    fresh-input probe warns about them, tests/strict_hostile.rs)."""
    before = evaluate(worker, tmp_path, "honest", mode)
    verdicts = {name: evaluate(worker, tmp_path, name, mode) for name in ("gc_stealer.py", "compare_patcher.py", "trial_patcher.py")}
    after = evaluate(worker, tmp_path, "honest", mode)
    for response in (before, after):
        assert response["status"] == "correct" and response["correctness"] is True, response
    for name, response in verdicts.items():
        if mode == "faithful":
            assert response["status"] == "correct", (name, response)  # as KernelBench would judge it
            continue
        assert response["status"] != "correct" and response["speedup"] is None, (name, response)
    if mode == "strict":
        assert verdicts["compare_patcher.py"]["metadata"]["correctness_issue"] == "Output mismatch"
        assert verdicts["compare_patcher.py"]["metadata"]["correctness_trials"] == "(0 / 5)"
        # trial_patcher's proxy reports trials passed to nobody: the worker counted its own.
        assert verdicts["trial_patcher.py"]["status"] == "incorrect", verdicts["trial_patcher.py"]


@pytest.mark.slow
def test_skipping_work_on_unchecked_calls_is_caught(worker: kb_eval.Worker, tmp_path: Path) -> None:
    response = evaluate(worker, tmp_path, "skipper.py", "strict")
    assert response["status"] == "incorrect" and response["speedup"] is None, response
    assert response["metadata"]["correctness_issue_name"] == "timed_output_mismatch", response


@pytest.mark.slow
def test_a_done_sent_before_the_work_copies_no_output(worker: kb_eval.Worker, tmp_path: Path) -> None:
    """early_done rewrites the harness in its process to answer each call before computing it: the
    worker's copy after `done` holds its poison, and a checked call fails. On a loaded machine the worker
    may copy only after the late work (20 ms) has finished: then every call's span holds that work, and
    the early answer gained nothing."""
    # Five timed calls: under MIN_CHECKS, so every call is checked (a poisoned copy never goes unseen).
    response = evaluate(worker, tmp_path, "early_done.py", "strict", trials=5)
    if response["status"] == "correct":
        assert response["runtime_stats"]["min"] >= 20.0, response["runtime_stats"]
        return
    assert response["status"] == "incorrect" and response["speedup"] is None, response
    assert response["metadata"]["correctness_issue_name"] == "timed_output_mismatch", response


@pytest.mark.slow
def test_the_time_is_the_workers_whatever_the_process_reads(worker: kb_eval.Worker, tmp_path: Path) -> None:
    """Both candidates sleep 25 ms per call; the forger runs every clock of its process ten times slow.
    Strict: both are timed by the worker's clock, which cannot read under the sleep (a causal floor, not a
    duration comparison), and neither carries a finding. Faithful: KernelBench's loop reads the forged
    clock (as KernelBench would), and the worker's fresh calls warn."""
    for name in ("sleep_honest.py", "sleep_forger.py"):
        strict = evaluate(worker, tmp_path / "strict", name, "strict", trials=5)
        assert strict["status"] == "correct", strict
        assert strict["runtime_stats"]["min"] >= 25.0, strict["runtime_stats"]
        assert "timing_patch" not in categories(strict) or name == "sleep_forger.py"
    faithful = evaluate(worker, tmp_path / "faithful", "sleep_forger.py", "faithful", trials=5)
    assert faithful["status"] == "correct", faithful
    assert faithful["runtime_stats"]["mean"] < 25.0  # the forged clock, credited as KernelBench would
    assert "memo_suspected" in categories(faithful), faithful["findings"]
    honest = evaluate(worker, tmp_path / "faithful", "sleep_honest.py", "faithful", trials=5)
    assert "memo_suspected" not in categories(honest), honest["findings"]


@pytest.mark.slow
def test_lowered_precision_is_refused_in_strict_mode_and_warned_in_faithful_mode(
    worker: kb_eval.Worker, tmp_path: Path
) -> None:
    """tf32_emulated passes KernelBench's trials (positive inputs) but not the precision probe (signed
    inputs, judged against float64 relative to the reference's own error)."""
    strict = evaluate(worker, tmp_path, "tf32_emulated.py", "strict")
    assert strict["status"] == "incorrect" and strict["speedup"] is None, strict
    assert strict["metadata"]["correctness_issue_name"] == "precision_lowered", strict
    assert strict["metadata"]["correctness_trials"] == "(5 / 5)"
    assert strict["metadata"]["precision"]["ratio"] >= 64, strict["metadata"]["precision"]
    faithful = evaluate(worker, tmp_path, "tf32_emulated.py", "faithful")
    assert faithful["status"] == "correct", faithful
    assert "precision_lowered" in categories(faithful)
    honest = evaluate(worker, tmp_path, "honest", "strict")
    assert honest["status"] == "correct"
    assert honest["metadata"]["precision"]["inputs"] == "signed"
    assert honest["metadata"]["precision"]["ratio"] < 16


@pytest.mark.slow
def test_strict_mode_serves_no_reference_data_on_request(worker: kb_eval.Worker, tmp_path: Path) -> None:
    response = evaluate(worker, tmp_path, "ask_in_strict.py", "strict")
    assert response["status"] == "runtime_error", response
    assert response["metadata"]["runtime_error_name"] == "forbidden_message", response
    assert evaluate(worker, tmp_path, "honest", "strict")["status"] == "correct"


@pytest.mark.slow
def test_a_forged_result_frame_fails_the_candidate(worker: kb_eval.Worker, tmp_path: Path) -> None:
    """forged_result writes a pickled "result" down what it finds of the channel: not a frame."""
    response = evaluate(worker, tmp_path, "forged_result.py", "strict")
    assert response["status"] == "runtime_error" and response["speedup"] is None, response
    assert categories(response) == ["forbidden_message"]
    assert evaluate(worker, tmp_path, "honest", "strict")["status"] == "correct"


@pytest.mark.slow
def test_the_reference_is_timed_in_the_candidates_regime(worker: kb_eval.Worker, tmp_path: Path) -> None:
    response = evaluate(worker, tmp_path, "honest", "strict")
    regimes = response["metadata"]["strict_timing"]
    assert regimes["reference_timed_in"] == "process", regimes
    candidate, reference = dict(regimes["candidate"]), dict(regimes["reference"])
    candidate.pop("checked"), reference.pop("checked")
    assert candidate == reference
    assert candidate["clock"].startswith("worker perf_counter") and candidate["calls"] == 11
    faithful = evaluate(worker, tmp_path, "honest", "faithful")
    assert "strict_timing" not in faithful["metadata"]


NO_FLOAT64 = PROBLEM.replace(
    "        return x * 2 + y",
    "        if x.dtype == torch.float64:\n            raise RuntimeError('no float64 here')\n        return x * 2 + y",
)


def _probe(code: str, hint: Any = None) -> kb_precision.Probe:
    spec = kb_reference.ReferenceSpec.of({**prepare_request(1, code), "mode": "strict", "precision_probe": hint})
    context = kb_reference.ReferenceCache().context(spec)
    assert context.error is None
    return kb_precision.probe_for(context)


def test_an_earlier_runs_probe_summary_spares_the_float64_forward() -> None:
    """The orchestrator keeps a probe's summary (src/worker/probes.rs) and sends it back: the probe is
    then the same inputs and expected output, the summary's error, with no float64 forward run (a
    reference that cannot run in float64 still gets its probe from the summary)."""
    full = _probe(PROBLEM)
    assert full.why is None and not full.from_hint and full.kind == "signed", full
    hinted = _probe(PROBLEM, full.wire())
    assert hinted.from_hint and (hinted.kind, hinted.e_ref) == (full.kind, full.e_ref)
    assert all(torch.equal(a, b) for a, b in zip(hinted.inputs or [], full.inputs or [], strict=True))
    assert torch.equal(hinted.expected, full.expected)
    assert _probe(NO_FLOAT64).why == "the reference's float64 forward failed: RuntimeError"
    spared = _probe(NO_FLOAT64, full.wire())
    assert spared.from_hint and spared.why is None and spared.e_ref == full.e_ref
    assert _probe(PROBLEM, {"why": "no floating-point inputs"}).why == "no floating-point inputs"


@pytest.mark.parametrize(
    "hint",
    [{"kind": "bogus", "e_ref": 1e-7}, {"kind": "signed", "e_ref": 0.5}, {"kind": "signed", "e_ref": -1.0},
     {"kind": "signed", "e_ref": float("nan")}, {"kind": "signed"}, {"e_ref": True, "kind": "signed"}, [1, 2], "x"],
)
def test_a_summary_that_is_not_one_makes_the_probe_in_full(hint: Any) -> None:
    probe = _probe(PROBLEM, hint)
    assert not probe.from_hint and probe.why is None and probe.kind == "signed", probe


@pytest.mark.slow
def test_the_worker_reports_its_own_probe_and_takes_a_summary_back(tmp_path: Path) -> None:
    """An evaluate response carries `precision_probe` when the worker made the probe itself; a worker
    given that summary judges the same candidate the same way and reports none (nothing made)."""
    first = kb_eval.Worker(isolate=True)
    try:
        made = evaluate(first, tmp_path / "a", "honest", "strict")
    finally:
        first.close()
    summary = made["precision_probe"]
    assert summary["kind"] == "signed" and summary["e_ref"] == made["metadata"]["precision"]["reference_error"]
    second = kb_eval.Worker(isolate=True)
    try:
        request = evaluate_request(2, MATMUL, HONEST, tmp_path / "b" / "honest", mode="strict", timing_trials=10)
        request["precision_probe"] = summary
        assert kb_protocol.check_request(request) == []
        again = kb_eval.evaluate(request, second)
        assert kb_protocol.check_response(again) == []
    finally:
        second.close()
    assert again["status"] == "correct" and "precision_probe" not in again, again
    assert again["metadata"]["precision"]["reference_error"] == summary["e_ref"]
    assert again["metadata"]["precision"]["ratio"] == made["metadata"]["precision"]["ratio"]
