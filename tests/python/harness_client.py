"""A small client for the harness's `serve` loop, used by the tests and by run_quickstart.py.

It speaks the protocol exactly as the Rust side does: JSON lines on the worker's stdin/stdout, stderr to
a log file, and it checks every line that comes back (the stream must stay clean whatever a candidate
prints).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
HARNESS_DIR = REPO / "src" / "harness"
HARNESS = HARNESS_DIR / "krefine_harness.py"
FIXTURES = REPO / "tests" / "fixtures"
HOSTILE = FIXTURES / "hostile"
PROTOCOL = FIXTURES / "protocol"
QUICKSTART = REPO / "configs" / "quickstart"

if str(HARNESS_DIR) not in sys.path:
    sys.path.insert(0, str(HARNESS_DIR))

import kb_protocol  # noqa: E402 - after the harness folder is put on sys.path


class ProtocolViolation(AssertionError):
    pass


class WorkerProcess:
    """One `serve` worker. Every line read back must be a JSON object that matches a protocol shape."""

    def __init__(self, role: str, scratch: Path, log: Path, python: str = sys.executable) -> None:
        scratch.mkdir(parents=True, exist_ok=True)
        self.log_path = log
        self._log = open(log, "wb")  # noqa: SIM115 - the worker's stderr for its whole life
        self.lines: list[bytes] = []
        # `progress` notices read while waiting for responses (reference work during an evaluate).
        self.progress: list[dict[str, Any]] = []
        self.proc = subprocess.Popen(
            [python, "-u", str(HARNESS), "serve", "--role", role, "--scratch", str(scratch)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            start_new_session=True,
        )
        self.ready = self.read()

    def read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise EOFError(f"worker closed its protocol stream (exit status {self.proc.poll()})")
        self.lines.append(line)
        try:
            message = json.loads(line)
        except ValueError as exc:
            raise ProtocolViolation(f"not JSON on the protocol stream: {line[:200]!r}") from exc
        problems = kb_protocol.check_response(message)
        if problems:
            raise ProtocolViolation(f"response does not match the protocol: {problems}")
        return message

    def send(self, request: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(request) + "\n").encode())
        self.proc.stdin.flush()

    def request(self, request: dict[str, Any]) -> dict[str, Any]:
        """Send a request and read its response; `progress` notices before it are kept in
        `self.progress` (they must carry the request's id and alternate start, end)."""
        self.send(request)
        response = self.read()
        state = "end"
        while response.get("kind") == "progress":
            if response["id"] != request["id"] or response["reference"] == state:
                raise ProtocolViolation(f"progress notice {response} out of turn (after {state!r})")
            state = response["reference"]
            self.progress.append(response)
            response = self.read()
        if state != "end":
            raise ProtocolViolation("a response came while reference work was still announced")
        if response["id"] != request["id"]:
            raise ProtocolViolation(f"response id {response['id']} for request {request['id']}")
        return response

    def close(self) -> int:
        if self.proc.poll() is None:
            with contextlib.suppress(EOFError, BrokenPipeError):
                self.request({"id": 10**6, "op": "shutdown"})
        try:
            code = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.kill()
            code = self.proc.wait()
        self._log.close()
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 9)


def compile_request(
    rid: int, source: str, build_dir: Path, log: Path, arch_list: str | None = None
) -> dict[str, Any]:
    return {
        "id": rid,
        "op": "compile",
        "source": source,
        "build_dir": str(build_dir),
        "arch_list": arch_list,
        "log_path": str(log),
    }


def evaluate_request(
    rid: int,
    problem_code: str,
    source: str,
    build_dir: Path,
    device: str = "cpu",
    mode: str = "faithful",
    measure: bool = True,
    trials: int = 5,
    precision: str = "fp32",
    timing_trials: int = 100,
    max_speedup: float | None = None,
    cast_integer_inputs: bool | None = None,
    timing_method: str | None = None,
    tolerance: dict[str, Any] | None = None,
    reference_compile: dict[str, str] | None = None,
) -> dict[str, Any]:
    request: dict[str, Any] = {
        "id": rid,
        "op": "evaluate",
        "problem": {"key": "test/1", "code": problem_code, "code_hash": "unused-by-the-harness"},
        "candidate": {"source": source, "build_dir": str(build_dir)},
        "device": device,
        "precision": precision,
        "mode": mode,
        "seed": 42,
        "correct_trials": trials,
        "timing": {
            "measure": measure,
            "warmup": 3,
            "trials": timing_trials,
            "discard_first": 1,
            "l2_flush": True,
        },
        "reference_runtime": None,
        "integrity": {"max_speedup": max_speedup, "peak_tflops": None, "peak_bandwidth_gbs": None},
    }
    if cast_integer_inputs is not None:
        request["cast_integer_inputs"] = cast_integer_inputs
    if timing_method is not None:
        request["timing"]["method"] = timing_method
    if tolerance is not None:
        request["tolerance"] = tolerance
    if reference_compile is not None:
        request["timing"]["reference_compile"] = reference_compile
    return request


def prepare_request(
    rid: int,
    problem_code: str,
    device: str = "cpu",
    measure: bool = True,
    trials: int = 5,
    steps: int | None = None,
    quiet: bool | None = None,
) -> dict[str, Any]:
    """A `prepare` request: evaluate's fields without a candidate; `steps` (the Rust side's background
    preparation sends 1) and `quiet` left out unless given."""
    request = evaluate_request(rid, problem_code, "", Path("."), device=device, measure=measure, trials=trials)
    del request["candidate"]
    del request["integrity"]
    request["op"] = "prepare"
    if steps is not None:
        request["steps"] = steps
    if quiet is not None:
        request["quiet"] = quiet
    return request


def profile_request(
    rid: int, problem_code: str, source: str, build_dir: Path, device: str = "cpu", ncu: bool = False
) -> dict[str, Any]:
    """A `profile` request: the reference spec an evaluate of the candidate carries, plus the
    profiler's own fields."""
    request = evaluate_request(rid, problem_code, source, build_dir, device=device)
    del request["integrity"]
    request["op"] = "profile"
    request["row_limit"] = 12
    request["ncu"] = ncu
    return request


_FENCE = re.compile(r"```(?:python|cpp)?[ \t]*\n(.*?)```", re.DOTALL)


def first_code_block(text: str) -> str | None:
    """The first fenced block with its python/cpp tag stripped (as KernelBench's extract_first_code)."""
    match = _FENCE.search(text)
    return match.group(1) if match else None


def quickstart_answers() -> list[dict[str, Any]]:
    lines = (QUICKSTART / "answers.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def quickstart_problem(problem: str) -> str:
    level, pid = problem.split("/")
    folder = QUICKSTART / "problems" / f"level{level}"
    (path,) = [p for p in folder.glob(f"{pid}_*.py")]
    return path.read_text()
