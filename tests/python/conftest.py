"""Shared fixtures. Real C++ builds are slow on a small CPU (20-60 s each), so the suite builds its few
real candidates (ok_cpp.py twice, compile_error.py) once per session, through one long-lived compile
worker."""

from __future__ import annotations

import gc
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness_client import HOSTILE, WorkerProcess, compile_request

# isort: split
# harness_client puts the harness on sys.path.
import kb_pch


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: builds a C++ extension or starts extra worker processes")
    # Workers run in the test process have no orchestrator to end a silent candidate process: give up on
    # one after this long instead of hanging the suite (kb_drive.FRAME_TIMEOUT_S).
    os.environ.setdefault("KREFINE_FRAME_TIMEOUT_S", "600")


@pytest.fixture(scope="session", autouse=True)
def split_builds() -> Iterator[None]:
    """The suite's C++ builds are split into two units on any machine (unset, KREFINE_SPLIT_CPP splits
    only with kb_split.SPLIT_MIN_CORES cores): what it asserts of builds and of the shared headers is
    the split build's. Workers started by the tests inherit it."""
    previous = os.environ.get("KREFINE_SPLIT_CPP")
    os.environ["KREFINE_SPLIT_CPP"] = "1"
    yield
    if previous is None:
        os.environ.pop("KREFINE_SPLIT_CPP", None)
    else:
        os.environ["KREFINE_SPLIT_CPP"] = previous


@pytest.fixture(scope="session", autouse=True)
def _working_folder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The suite runs in a folder of its own, as `serve` runs in its scratch (prepare_process): the
    workers it runs in-process (kb_eval.Worker) start candidate processes there, which take it as
    their scratch and temporary folder; from the repository root they wrote into the checkout
    (torch's `torchinductor_root`)."""
    before = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("cwd"))
    try:
        yield
    finally:
        os.chdir(before)


@pytest.fixture(autouse=True)
def _collector_unfrozen() -> Iterator[None]:
    """kb_memory.collect freezes what survives it (for a worker's life); a test that ran the harness in
    this process gives the collector its reach back, so the next test's garbage is collected as usual."""
    yield
    gc.unfreeze()


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
    """The real builds of the suite, keyed by fixture file name (response + build_dir).

    A compile child may not write the shared precompiled headers: the first build of a flag set goes
    without them (`ok_cpp_first.py`) while the worker has the two of a split build (kb_split.py) built in
    the background; once they are there, the same candidate builds the fast way (`ok_cpp.py`), and so
    does `compile_error.py`'s attempt."""
    results: dict[str, dict[str, Any]] = {}

    def build(rid: int, key: str, name: str) -> None:
        folder = work / "build" / key.removesuffix(".py")
        response = cpu_worker.request(compile_request(rid, hostile(name), folder, work / "logs" / f"{key}.log"))
        results[key] = {"response": response, "build_dir": folder}

    build(1, "ok_cpp_first.py", "ok_cpp.py")
    pch_root = work / "build" / "pch"
    deadline = time.monotonic() + 900

    split_headers = {kb_pch.PCH_TEXTS["candidate"], kb_pch.PCH_TEXTS["bindings"]}

    def published() -> bool:  # a folder still being written is `<key>.tmp-*`
        done = [p for p in pch_root.glob("*/krefine_pch.h.gch") if ".tmp-" not in p.parent.name]
        texts = {Path(str(p)[: -len(".gch")]).read_text() for p in done}
        return split_headers <= texts or bool(list(pch_root.glob("*.failed")))

    while not published():
        assert time.monotonic() < deadline, "the worker never built the shared precompiled header"
        time.sleep(0.5)
    build(2, "ok_cpp.py", "ok_cpp.py")
    build(3, "compile_error.py", "compile_error.py")
    return results
