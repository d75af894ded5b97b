"""Shared fixtures. Real C++ builds are slow on a small CPU (20-60 s each), so the suite builds exactly
two (ok_cpp.py and compile_error.py), once per session, through one long-lived compile worker."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness_client import HOSTILE, WorkerProcess, compile_request  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: builds a C++ extension or starts extra worker processes")


@pytest.fixture(scope="session")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("harness")


@pytest.fixture(scope="session")
def cpu_worker(work: Path) -> Iterator[WorkerProcess]:
    """One `serve --role compile` worker for the whole session: compiles and CPU evaluations share it,
    which also exercises a long-lived worker across many candidates."""
    worker = WorkerProcess("compile", work / "scratch", work / "worker.log")
    yield worker
    assert worker.close() == 0


@pytest.fixture(scope="session")
def problem_add() -> str:
    return (HOSTILE / "problem_add.py").read_text()


def hostile(name: str) -> str:
    return (HOSTILE / name).read_text()


@pytest.fixture(scope="session")
def compiled(cpu_worker: WorkerProcess, work: Path) -> dict[str, dict[str, Any]]:
    """The two real builds of the suite, keyed by fixture file name (response + build_dir)."""
    results: dict[str, dict[str, Any]] = {}
    for rid, name in enumerate(["ok_cpp.py", "compile_error.py"], start=1):
        build = work / "build" / name.removesuffix(".py")
        response = cpu_worker.request(
            compile_request(rid, hostile(name), build, work / "logs" / f"{name}.log")
        )
        results[name] = {"response": response, "build_dir": build}
    return results
