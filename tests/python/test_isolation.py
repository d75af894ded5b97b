"""The hostile set on the CPU: candidates that cheat, leak state, or share an extension name, evaluated
one after another in one worker, each in its own single-use process (the real thing, not the in-process
mode of test_eval.py). Every assertion is about verdicts, findings and flags, never about durations.

All candidates build (a stand-in for) an extension named `fast_matmul`; in one process the first one
imported would serve every later candidate (tests/fixtures/integrity/honest.py says how).
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import kb_candidate
import kb_eval
import kb_pool
import kb_prepare
import kb_process
import kb_protocol
from harness_client import FIXTURES, evaluate_request, prepare_request

INTEGRITY = FIXTURES / "integrity"
MATMUL = (INTEGRITY / "problem_matmul.py").read_text()
ADVERSARIAL = ["result_reuse.py", "zero_out.py", "side_thread.py"]

pytestmark = pytest.mark.slow  # every candidate starts a process that imports torch


class IsolatedWorker:
    """One worker (as `serve` holds it) whose candidates run in their own processes."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.worker = kb_eval.Worker(isolate=True)
        self.worker.on_child_death = self._died
        self.count = 0
        assert kb_prepare.prepare(prepare_request(1, MATMUL), self.worker)["status"] == "ready"

    @staticmethod
    def _died(died: kb_process.ChildDied) -> None:
        raise AssertionError(f"a candidate process died: {died}")

    def evaluate(self, name: str, mode: str = "faithful", measure: bool = True, **options: Any) -> dict[str, Any]:
        self.count += 1
        source = (INTEGRITY / name).read_text()
        request = evaluate_request(
            self.count + 1, MATMUL, source, self.root / f"c{self.count}", mode=mode, measure=measure,
            timing_trials=options.pop("timing_trials", 10), **options,
        )
        response = kb_eval.evaluate(request, self.worker)
        assert kb_protocol.check_response(response) == []
        assert response["env"]["isolation"] == "process"
        return response


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[IsolatedWorker]:
    isolated = IsolatedWorker(tmp_path_factory.mktemp("isolation"))
    yield isolated
    isolated.worker.close()


def categories(response: dict[str, Any], severity: str) -> set[str]:
    return {f["category"] for f in response["findings"] if f["severity"] == severity}


def superpermutation(items: list[str]) -> list[str]:
    """A shortest sequence holding every order of three items as consecutive runs (1 2 3 1 2 1 3 2 1)."""
    a, b, c = items
    sequence = [a, b, c, a, b, a, c, b, a]
    for order in itertools.permutations(items):
        assert any(tuple(sequence[i : i + 3]) == order for i in range(len(sequence) - 2)), order
    return sequence


def judge_adversarial(name: str, response: dict[str, Any], mode: str) -> None:
    """Each adversarial kernel's verdict from its own code, whatever ran before it."""
    assert response["status"] == "incorrect", (name, mode, response["feedback"])
    assert response["speedup"] is None
    if name == "zero_out.py" and mode == "strict":
        assert response["metadata"]["correctness_issue_name"] == "input_modified"
    if name == "side_thread.py":
        # Not credited in either mode, and the work it leaves running is reported: a warning in
        # faithful mode, the reason it fails in strict mode.
        expected = "error" if mode == "strict" else "warning"
        assert "thread_left_running" in categories(response, expected), response["findings"]
    else:
        assert categories(response, "error") == set(), response["findings"]


def test_adversarial_kernels_in_every_order_are_judged_by_their_own_code(worker: IsolatedWorker) -> None:
    for name in superpermutation(ADVERSARIAL):
        judge_adversarial(name, worker.evaluate(name, measure=False), "faithful")
    for name in ADVERSARIAL:
        judge_adversarial(name, worker.evaluate(name, mode="strict", measure=False), "strict")
    # The honest control, after all of them: correct, nothing found.
    honest = worker.evaluate("honest.py", mode="strict", measure=False)
    assert honest["status"] == "correct" and honest["findings"] == [], honest["feedback"]


@pytest.mark.parametrize("mode", ["faithful", "strict"])
def test_three_turns_timer_patch_honest_memoise(worker: IsolatedWorker, mode: str) -> None:
    alone = worker.evaluate("honest.py", mode=mode)
    patched = worker.evaluate("timer_patch.py", mode=mode)
    honest = worker.evaluate("honest.py", mode=mode)
    memoised = worker.evaluate("memoise.py", mode=mode)
    # The honest turn is judged exactly as when it runs alone: same verdict, no findings, the same
    # settings in its process, and none of the patched turn's state.
    for result in (alone, honest):
        assert result["status"] == "correct" and result["findings"] == [], result["feedback"]
        assert result["speedup_check"] is not None  # flagged or not is a timing, not asserted here
    assert honest["env"]["settings"] == alone["env"]["settings"]
    # The timer patch is seen; it never reaches the timer (the timer was captured before the import).
    if mode == "strict":
        assert patched["status"] == "incorrect" and patched["speedup"] is None
        assert "timing_patch" in categories(patched, "error")
        assert patched["metadata"]["integrity_issue_name"] == "timing_patch"
    else:
        assert patched["status"] == "correct"
        assert "timing_patch" in categories(patched, "warning")
        # That the patch never reaches the timer (the loop keeps the clock it captured) is asserted
        # exactly in test_timing; speeds are not compared here.
    # The memoising turn: KernelBench's loop cannot see it (faithful: correct, as KernelBench judges it;
    # its speedup is only flagged when above the bound). Strict timing gives every call fresh inputs and
    # checks the outputs, so it fails and no speedup is credited.
    if mode == "strict":
        assert memoised["status"] == "incorrect" and memoised["speedup"] is None, memoised["feedback"]
        assert memoised["metadata"]["correctness_issue_name"] == "timed_output_mismatch"
    else:
        assert memoised["status"] == "correct", memoised["feedback"]
        assert memoised["speedup_check"] is not None


@pytest.mark.parametrize(
    ("name", "category"),
    [
        ("tf32_at_import.py", "settings_changed"),
        ("threads_at_import.py", "settings_changed"),
        ("lazy_output.py", "non_dense_output"),
    ],
)
def test_process_state_hacks_warn_in_faithful_and_fail_in_strict(
    worker: IsolatedWorker, name: str, category: str
) -> None:
    faithful = worker.evaluate(name, measure=False)
    assert faithful["status"] == "correct", faithful["feedback"]
    assert category in categories(faithful, "warning")
    assert "Warning (integrity)" in faithful["feedback"]
    strict = worker.evaluate(name, mode="strict", measure=False)
    assert (strict["status"], strict["correctness"]) == ("incorrect", False)
    assert category in categories(strict, "error")
    assert strict["metadata"]["integrity_issue_name"] == category
    # The next candidate runs with the reference's settings again.
    after = worker.evaluate("honest.py", measure=False)
    assert after["status"] == "correct" and after["findings"] == []
    assert after["env"]["settings"] == faithful["env"]["settings"]


def test_strict_reverifies_a_speedup_above_the_bound(worker: IsolatedWorker) -> None:
    # A bound no real kernel can stay under forces the guard: the honest kernel is re-timed in a fresh
    # process on input sets no candidate has seen, and its speedup is confirmed or not; either way the
    # check says what it did.
    r = worker.evaluate("honest.py", mode="strict", max_speedup=1e-9)
    check = r["speedup_check"]
    assert r["status"] == "correct"
    assert check["flagged"] is True and check["bound_source"] == "config"
    assert check["verified"] is not None and check["reverified_speedup"] is not None
    faithful = worker.evaluate("honest.py", max_speedup=1e-9)
    assert faithful["speedup_check"]["flagged"] is True
    assert faithful["speedup_check"]["verified"] is None  # faithful mode only flags


def test_the_output_capture_leaves_no_native_thread_behind(tmp_path: Path) -> None:
    """capture_fds's pump thread has left /proc/self/task when the capture ends: Python sees a thread
    stopped a moment before its OS thread exits, and the candidate checks count native threads (an
    honest candidate once got a `native_threads` finding for the harness's own pump on a busy machine)."""
    import kb_compile

    before = kb_candidate.native_threads()
    for i in range(50):
        with kb_compile.capture_fds(str(tmp_path / "log.txt")):
            print(f"line {i}", flush=True)
        assert kb_candidate.native_threads() == before
    assert "line 49" in (tmp_path / "log.txt").read_text()


def test_the_lease_trace_says_where_a_jobs_time_went(
    worker: IsolatedWorker, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """KREFINE_LEASE_TRACE: one line per job in the worker's log, its phases and the worker's steps;
    nothing without it."""
    worker.evaluate("honest.py", timing_trials=3)
    assert "lease trace" not in capsys.readouterr().err
    monkeypatch.setenv(kb_pool.LEASE_TRACE, "1")
    worker.evaluate("honest.py", timing_trials=3)
    worker.evaluate("zero_out.py", measure=False)
    traced = [line for line in capsys.readouterr().err.splitlines() if "lease trace" in line]
    lines = [line for line in traced if " tail " not in line]
    tails = [line for line in traced if " tail " in line]
    assert len(lines) == 2, lines
    honest, failing = lines
    # After each evaluation's job, the worker's own steps until it answers: one `tail` line each.
    assert len(tails) == 2, tails
    for tail in tails:
        for step in ("total=", "tail_reference=", "tail_release_gc=", "tail_spares=", "tail_response=", "tail_memory="):
            assert step in tail, (step, tail)
    assert " evaluate c" in honest and " correct total=" in honest, honest
    for step in ("take=", "warm_spares=", "process=", "ask_trial=", "ask_verify=", "fresh_probe=", "retire="):
        assert step in honest, (step, honest)
    assert "correctness_s=" in honest and "isolation_s=" in honest, honest
    assert " incorrect total=" in failing and "fresh_probe=" not in failing, failing


def test_a_candidate_process_keeps_its_start_up_objects_out_of_the_collector(worker: IsolatedWorker) -> None:
    """Torch's and the harness's objects are frozen before the candidate is loaded
    (kb_memory.freeze_startup_objects): a collection in the job (kb_memory.release_memory, 0.1 s of
    the lease each when it walked them all) sees only what the job made."""
    worker.count += 1
    source = "import gc\nraise RuntimeError(f'frozen={gc.get_freeze_count()}')\n"
    request = evaluate_request(worker.count + 1, MATMUL, source, worker.root / f"c{worker.count}", measure=False)
    response = kb_eval.evaluate(request, worker.worker)
    said = re.search(r"frozen=(\d+)", json.dumps(response))
    assert said is not None, response["feedback"]
    assert int(said[1]) > 10_000
