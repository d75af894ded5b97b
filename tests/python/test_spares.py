"""No spare candidate process is still starting while something is timed (issue 23, the honest control's
band): a starting process creates its CUDA context and L2 flush buffer on the device, and a call timed
meanwhile shares the GPU with that work. Real worker and candidate processes on the CPU; nothing here
compares durations: what is asserted is which spares the worker waited for before a timed loop."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

import kb_eval
import kb_pool
from harness_client import FIXTURES, evaluate_request

MATMUL = (FIXTURES / "integrity" / "problem_matmul.py").read_text()
HONEST = (FIXTURES / "integrity" / "honest.py").read_text()


@pytest.mark.parametrize("mode", ["faithful", "strict"])
def test_spares_started_after_a_candidate_are_ready_before_the_next_is_timed(
    mode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two spares, so one stays in the pool while the other serves the next candidate.
    monkeypatch.setitem(kb_pool.SPARES, "cpu", 2)
    worker = kb_eval.Worker(isolate=True)
    try:
        first = kb_eval.evaluate(evaluate_request(1, MATMUL, HONEST, tmp_path / "a", mode=mode, timing_trials=5), worker)
        assert first["status"] == "correct", first
        # The spares the worker started at the end of that evaluation: nothing has waited for them yet.
        pending = list(worker.spares)
        assert len(pending) == 2 and not any(p.ready for p in pending)

        waited: list[list[bool]] = []
        settle = worker.settle_spares

        def observed() -> None:
            settle()
            waited.append([p.ready for p in worker.spares])

        monkeypatch.setattr(worker, "settle_spares", observed)
        # The next candidate, back to back (the reference's time is cached): it runs in the first of the
        # two spares; the second sits in the pool (unless a second job takes it), still starting for all
        # the harness knew before.
        second = kb_eval.evaluate(evaluate_request(2, MATMUL, HONEST, tmp_path / "b", mode=mode, timing_trials=5), worker)
        assert second["status"] == "correct" and second["speedup"] is not None, second
        # The worker waited before each timed loop, and every spare was ready then (before, nothing
        # waited: only the process taken for a job was ever waited for).
        assert waited and all(all(ready) for ready in waited), waited
        assert pending[1].ready
    finally:
        worker.close()


def test_a_spare_that_never_finishes_starting_is_dropped_not_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kb_pool, "SPARE_START_TIMEOUT_S", 0.2)
    worker = kb_eval.Worker(isolate=True)
    parent, child = multiprocessing.Pipe()  # its "ready" never comes

    class Stuck:
        ready = False
        conn = parent
        killed = False

        def kill(self) -> None:
            self.killed = True

        def wait_ready(self) -> None:
            raise AssertionError("waited for a spare that never finished starting")

    stuck = Stuck()
    worker.spares.append(stuck)  # type: ignore[arg-type]
    worker.settle_spares()
    assert worker.spares == [] and stuck.killed
    child.close()
    worker.close()
