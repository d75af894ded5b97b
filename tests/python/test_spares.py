"""No spare candidate process creates its device context while something is timed (issue 23, the honest
control's band): on the H200 a CUDA context being created slows about one call in five timed meanwhile
on the same GPU. A spare's start is a CPU step, then a device step the worker grants only between timed
loops (kb_process). Real worker and candidate processes on the CPU; nothing here compares durations:
what is asserted is the order of grants and timed loops, and what the worker waited for."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path
from typing import Any

import pytest

import kb_channel
import kb_drive
import kb_eval
import kb_pool
import kb_process
from harness_client import FIXTURES, evaluate_request

MATMUL = (FIXTURES / "integrity" / "problem_matmul.py").read_text()
HONEST = (FIXTURES / "integrity" / "honest.py").read_text()


@pytest.mark.parametrize("mode", ["faithful", "strict"])
def test_no_spare_takes_its_device_step_while_a_candidate_is_timed(
    mode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two spares, so one stays in the pool while the other serves the next candidate.
    monkeypatch.setitem(kb_pool.SPARES, "cpu", 2)
    log: list[Any] = []
    grant, run = kb_process.CandidateProcess.grant, kb_drive.Driver.run

    def logged_grant(self: kb_process.CandidateProcess) -> bool:
        granted = grant(self)
        if granted:
            log.append("grant")
        return granted

    def logged_run(self: kb_drive.Driver, *args: Any, **kwargs: Any) -> Any:
        result = run(self, *args, **kwargs)
        log.append("result")
        return result

    def logged_reference(*args: Any, **kwargs: Any) -> list[float]:  # the worker timing the reference itself
        times = time_reference(*args, **kwargs)
        log.append("timed")
        return times

    time_reference = kb_eval.time_reference
    monkeypatch.setattr(kb_process.CandidateProcess, "grant", logged_grant)
    monkeypatch.setattr(kb_drive.Driver, "run", logged_run)
    monkeypatch.setattr(kb_eval, "time_reference", logged_reference)
    worker = kb_eval.Worker(isolate=True)
    settle = worker.settle_spares

    def logged_settle() -> None:
        settle()
        log.append(("timing", [p.state for p in worker.spares]))

    monkeypatch.setattr(worker, "settle_spares", logged_settle)
    try:
        for index in range(3):  # back to back; the reference's time is cached after the first
            response = kb_eval.evaluate(
                evaluate_request(index, MATMUL, HONEST, tmp_path / str(index), mode=mode, timing_trials=5), worker
            )
            assert response["status"] == "correct" and response["speedup"] is not None, response
    finally:
        worker.close()
    timed = [i for i, entry in enumerate(log) if isinstance(entry, tuple)]
    assert len(timed) >= 3 and "grant" in log, log
    for i in timed:
        # When a timed loop starts, no spare is in its device step...
        assert "granted" not in log[i][1], log
        # ...and none is granted one until that job's result is in (or the worker's own loop is done).
        end = next(j for j in range(i, len(log)) if log[j] in ("result", "timed"))
        assert "grant" not in log[i:end], log


def test_candidate_processes_start_from_the_preloaded_harness(tmp_path: Path) -> None:
    """The forkserver preloads torch and the harness, so a candidate process does not import them
    itself (before, CPython 3.11 and 3.12.3 dropped the preload silently: seconds per process)."""
    before = os.environ.get("PYTHONPATH")
    process = kb_process.CandidateProcess("cpu")
    try:
        process.wait_ready()
        assert process.preloaded is True
        assert process.ready and process.state == "ready"
    finally:
        process.kill()
    # The worker's own environment is as it was.
    assert os.environ.get("PYTHONPATH") == before


def test_a_spare_that_never_finishes_starting_is_dropped_not_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kb_pool, "SPARE_START_TIMEOUT_S", 0.2)
    worker = kb_eval.Worker(isolate=True)
    parent, child = multiprocessing.Pipe()  # its "ready" never comes

    class Stuck:
        state = "granted"  # its device step granted; "ready" never comes
        channel = kb_channel.Channel(parent)
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


def test_a_candidate_process_inherits_the_workers_pythonpath_not_the_forkservers(tmp_path: Path) -> None:
    """The forkserver starts with the harness's folder on PYTHONPATH (so that it can preload the harness)
    and takes it back out as it preloads: a candidate process, and what it starts, sees PYTHONPATH as the
    worker had it."""
    candidate = 'import os\nraise RuntimeError("PYTHONPATH=" + repr(os.environ.get("PYTHONPATH")))\n'
    worker = kb_eval.Worker(isolate=True)
    try:
        response = kb_eval.evaluate(evaluate_request(1, MATMUL, candidate, tmp_path / "c", measure=False), worker)
    finally:
        worker.close()
    assert response["status"] != "correct", response
    assert "PYTHONPATH=" + repr(os.environ.get("PYTHONPATH")) in response["feedback"], response["feedback"]
    assert kb_process.HARNESS_DIR not in (os.environ.get("PYTHONPATH") or "")


def test_a_serving_gpu_worker_starts_its_forkserver_before_its_first_job(tmp_path: Path) -> None:
    """The forkserver (a torch import, about 2 s) starts with the worker, not inside the first job's
    lease (kb_pool.Worker.start_early); a compile worker starts none."""
    import time

    from harness_client import WorkerProcess

    def children(pid: int) -> list[str]:
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    parent = int(stat.read().rsplit(")", 1)[1].split()[1])
                with open(f"/proc/{entry}/cmdline", "rb") as cmd:
                    line = cmd.read().replace(b"\0", b" ").decode(errors="replace")
            except (OSError, ValueError, IndexError):
                continue
            if parent == pid:
                found.append(line)
        return found

    gpu = WorkerProcess("gpu", tmp_path / "gpu", tmp_path / "gpu.log")
    compile_worker = WorkerProcess("compile", tmp_path / "compile", tmp_path / "compile.log")
    try:
        deadline = time.monotonic() + 60
        while not any("forkserver" in c for c in children(gpu.proc.pid)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert any("forkserver" in c for c in children(gpu.proc.pid)), children(gpu.proc.pid)
        assert not any("forkserver" in c for c in children(compile_worker.proc.pid))
    finally:
        gpu.close()
        compile_worker.close()


def test_a_forkserver_that_cannot_start_early_costs_the_worker_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Starting the forkserver at the worker's start is for speed only: a failure there is logged, and the
    worker goes on (its first job starts the server, with its own retries)."""

    def refuse(method: str) -> Any:
        raise OSError("no room for a process")

    monkeypatch.setattr(kb_process, "process_context", refuse)
    worker = kb_pool.Worker(isolate=True)
    worker.start_early()
    assert worker.start_method == "forkserver" and worker.spares == []
