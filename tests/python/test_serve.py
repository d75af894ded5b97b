"""The real `serve` loop as a subprocess with pipes, as the Rust side drives it: the two real C++ builds,
every hostile candidate, and a protocol stream that stays clean whatever candidates print."""

from __future__ import annotations

import json
import select
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import hostile
from harness_client import WorkerProcess, evaluate_request, profile_request

pytestmark = pytest.mark.slow


def test_ready_message(cpu_worker: WorkerProcess) -> None:
    ready = cpu_worker.ready
    assert ready["kind"] == "ready" and ready["id"] == 0 and ready["ok"] is True
    assert ready["role"] == "compile"
    assert ready["pid"] == cpu_worker.proc.pid
    assert ready["python"] == ".".join(str(v) for v in sys.version_info[:3])
    assert ready["device"] is None  # a compile worker never touches the GPU


def test_compile_ok(compiled: dict[str, dict[str, Any]]) -> None:
    response = compiled["ok_cpp.py"]["response"]
    assert (response["status"], response["error_name"], response["error"], response["feedback"]) == (
        "ok",
        None,
        None,
        "",
    )
    assert response["duration_s"] > 0
    # The compiler ran as a child of the worker: its CPU time is counted (the CPU budget's measure).
    assert response["cpu_s"] > 0
    assert Path(response["log_path"]).exists()
    build = compiled["ok_cpp.py"]["build_dir"]
    assert (build / "candidate.py").read_text() == hostile("ok_cpp.py")
    assert list(build.rglob("krefine_fixture_ok_add*.so"))


def test_compile_error_feedback_is_trimmed(compiled: dict[str, dict[str, Any]]) -> None:
    response = compiled["compile_error.py"]["response"]
    assert response["status"] == "compile_error"
    assert response["error_name"] == "builtins.RuntimeError"
    # verbose=True: torch's message is short, the diagnostics are in the captured log.
    assert response["error"] == "Error building extension 'krefine_fixture_compile_error'"
    log = Path(response["log_path"]).read_text()
    assert "error: expected" in log and "ninja" in log
    feedback = response["feedback"]
    assert feedback.startswith("Compilation failed (builtins.RuntimeError).\n")
    assert "krefine_fixture_compile_error/main.cpp:7:5: error: expected" in feedback
    assert "c++ -MMD" not in feedback and "ninja:" not in feedback and "FAILED" not in feedback
    assert str(compiled["compile_error.py"]["build_dir"]) not in feedback
    assert len(feedback.splitlines()) <= 60 and len(feedback) <= 4200


def _evaluate(
    worker: WorkerProcess, problem: str, name: str, build: Path, rid: int, **options: Any
) -> dict[str, Any]:
    return worker.request(evaluate_request(rid, problem, hostile(name), build, **options))


def test_evaluate_the_built_candidate(
    cpu_worker: WorkerProcess, compiled: dict[str, dict[str, Any]], problem_add: str
) -> None:
    build = compiled["ok_cpp.py"]["build_dir"]
    r = _evaluate(cpu_worker, problem_add, "ok_cpp.py", build, 100)
    assert (r["status"], r["compiled"], r["correctness"]) == ("correct", True, True)
    assert r["metadata"]["correctness_trials"] == "(5 / 5)"
    assert r["runtime"] > 0 and r["ref_runtime"] > 0 and r["speedup"] > 0
    assert r["phases"]["load_s"] < 15, "the evaluate import must reuse the build, not rebuild"


EXPECTED = {
    # name: (mode, status, compiled, a piece of the feedback)
    "shape_mismatch.py": ("faithful", "incorrect", True, "Output shape mismatch in correctness trial 1 of 5"),
    "value_mismatch.py": ("faithful", "incorrect", True, "first mismatch at index (0, 3)"),
    "print_flood.py": ("faithful", "correct", True, "Correctness: 5 / 5 trials passed"),
    "inplace_input.py": ("faithful", "correct", True, "wrote into its input tensors"),
    "no_modelnew.py": ("faithful", "compile_error", False, "does not define `class ModelNew`"),
    "syntax_error.py": ("faithful", "compile_error", False, "SyntaxError: expected ':'"),
    "reuse_freed.py": ("faithful", "incorrect", True, "output mismatch"),
    "huge_alloc.py": ("faithful", "out_of_memory", True, "Out of memory in correctness trial 1 of 5"),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_hostile_candidates(cpu_worker: WorkerProcess, work: Path, problem_add: str, name: str) -> None:
    mode, status, compiled, piece = EXPECTED[name]
    r = _evaluate(
        cpu_worker, problem_add, name, work / "build" / name, 200 + sorted(EXPECTED).index(name), mode=mode
    )
    assert (r["status"], r["compiled"], r["sticky"]) == (status, compiled, False)
    assert piece in r["feedback"]


def test_strict_mode_through_serve(cpu_worker: WorkerProcess, work: Path, problem_add: str) -> None:
    inplace = _evaluate(
        cpu_worker, problem_add, "inplace_input.py", work / "build" / "ip", 300, mode="strict"
    )
    assert inplace["status"] == "incorrect"
    assert inplace["metadata"]["correctness_issue"] == "Input modified in place: input 0"
    freed = _evaluate(cpu_worker, problem_add, "reuse_freed.py", work / "build" / "rf", 301, mode="strict")
    assert freed["status"] == "incorrect"
    # After both, an honest candidate still sees pristine inputs in both modes.
    for rid, mode in enumerate(("strict", "faithful"), start=302):
        r = _evaluate(
            cpu_worker, problem_add, "value_mismatch.py", work / "build" / "vm", rid, mode=mode, measure=False
        )
        assert r["metadata"]["max_difference"] == ["1.000000"] * 5


def test_print_flood_stays_in_the_log(cpu_worker: WorkerProcess, work: Path, problem_add: str) -> None:
    _evaluate(cpu_worker, problem_add, "print_flood.py", work / "build" / "pf", 400)
    # Every protocol line so far parsed as a response (WorkerProcess.read checks each one).
    assert all(line.startswith(b'{"id": ') for line in cpu_worker.lines)
    assert not any(b"flood" in line for line in cpu_worker.lines)
    import_log = (work / "build" / "pf" / "load.log").read_bytes()
    assert import_log.count(b"flood flood") > 10_000  # the import's output went to the load log
    assert b"printf from C without a newline" in cpu_worker.log_path.read_bytes()  # forward's went to stderr


def test_profile_through_serve(
    cpu_worker: WorkerProcess, compiled: dict[str, dict[str, Any]], problem_add: str
) -> None:
    build = compiled["ok_cpp.py"]["build_dir"]
    r = cpu_worker.request(profile_request(500, problem_add, hostile("ok_cpp.py"), build, ncu=True))
    assert r["status"] == "ok" and not r["sticky"], r.get("error") or r.get("table") or r.get("note")
    assert "ModelNew.forward" in r["table"] and "Self CPU time total" in r["table"]
    assert r["ncu"] is None and r["note"] == "ncu needs a CUDA device"


def test_profiler_choice_through_serve(
    cpu_worker: WorkerProcess, compiled: dict[str, dict[str, Any]], problem_add: str
) -> None:
    build = compiled["ok_cpp.py"]["build_dir"]
    only_ncu = profile_request(501, problem_add, hostile("ok_cpp.py"), build) | {"profiler": "ncu"}
    r = cpu_worker.request(only_ncu)
    # Counters that cannot be read are one line of feedback, never a failed profile.
    assert r["status"] == "ok" and r["note"] == "ncu needs a CUDA device"
    assert r["table"] == "Nsight Compute: counters unavailable (ncu needs a CUDA device)."
    only_torch = profile_request(502, problem_add, hostile("ok_cpp.py"), build, ncu=True) | {"profiler": "torch"}
    r = cpu_worker.request(only_torch)
    assert r["status"] == "ok" and r["note"] is None and r["ncu"] is None
    assert "Self CPU time total" in r["table"] and "Nsight" not in r["table"]


def test_malformed_requests_get_ok_false(cpu_worker: WorkerProcess, problem_add: str, work: Path) -> None:
    cpu_worker.send({"id": 600, "op": "evaluate"})
    bad = cpu_worker.read()
    assert (bad["id"], bad["ok"], bad["kind"]) == (600, False, "evaluate")
    assert bad["error"].startswith("malformed request: $: missing field")
    assert cpu_worker.proc.stdin is not None
    cpu_worker.proc.stdin.write(b"this is not json\n")
    cpu_worker.proc.stdin.flush()
    assert cpu_worker.read() == {
        "id": 0,
        "ok": False,
        "kind": "error",
        "error": "request is not JSON: Expecting value: line 1 column 1 (char 0)",
    }
    cuda = evaluate_request(601, problem_add, hostile("ok_cpp.py"), work / "build" / "x", device="cuda:0")
    refused = cpu_worker.request(cuda)
    assert refused["ok"] is False and "compile worker does not use the GPU" in refused["error"]


# ---------------------------------------------------------------- candidates that end the worker


def _doomed_worker(work: Path, name: str, problem: str) -> WorkerProcess:
    worker = WorkerProcess("compile", work / f"scratch_{name}", work / f"{name}.log")
    worker.send(evaluate_request(1, problem, hostile(name), work / "build" / name, measure=False))
    return worker


def _not_progress(worker: WorkerProcess) -> list[dict[str, Any]]:
    """The lines after `ready` that are not `progress` notices (the reference built on demand)."""
    later = [json.loads(line) for line in worker.lines[1:]]
    return [m for m in later if m.get("kind") != "progress"]


@pytest.mark.parametrize(("name", "code"), [("exit3.py", 3), ("segfault.py", -signal.SIGSEGV)])
def test_candidates_that_kill_the_worker(work: Path, problem_add: str, name: str, code: int) -> None:
    worker = _doomed_worker(work, name, problem_add)
    with pytest.raises(EOFError):
        while True:  # notices of the reference work, then the end of the stream, never an answer
            worker.read()
    assert worker.proc.wait(timeout=30) == code
    assert json.loads(worker.lines[0])["kind"] == "ready" and _not_progress(worker) == []


def test_infinite_loop_never_answers(work: Path, problem_add: str) -> None:
    worker = _doomed_worker(work, "infinite_loop.py", problem_add)
    assert worker.proc.stdout is not None
    while True:  # reference-work notices may come first; after them, nothing
        readable, _, _ = select.select([worker.proc.stdout], [], [], 5.0)
        if not readable:
            break
        assert worker.read()["kind"] == "progress"
    assert _not_progress(worker) == []  # the Rust side's timeout must end this one
    worker.kill()
    assert worker.proc.wait(timeout=30) == -signal.SIGKILL


def test_shutdown_exits_zero(work: Path) -> None:
    worker = WorkerProcess("compile", work / "scratch_shutdown", work / "shutdown.log")
    assert worker.request({"id": 7, "op": "shutdown"}) == {"id": 7, "ok": True, "kind": "shutdown"}
    assert worker.proc.wait(timeout=30) == 0


def test_closing_stdin_exits_zero(work: Path) -> None:
    worker = WorkerProcess("compile", work / "scratch_eof", work / "eof.log")
    assert worker.proc.stdin is not None
    worker.proc.stdin.close()
    assert worker.proc.wait(timeout=30) == 0
