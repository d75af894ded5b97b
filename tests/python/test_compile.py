"""Loading candidates in-process (pure-Python candidates; the real C++ builds are in test_serve.py)."""

from __future__ import annotations

import ctypes
import json
import os
import sys
from pathlib import Path

import pytest

import kb_compile


def test_error_name_is_module_dot_class() -> None:
    assert kb_compile.get_error_name(RuntimeError("x")) == "builtins.RuntimeError"
    assert kb_compile.get_error_name(json.JSONDecodeError("m", "d", 0)) == "json.decoder.JSONDecodeError"


def test_stale_locks_are_removed(tmp_path: Path) -> None:
    for ext in ("a", "b"):
        (tmp_path / ext).mkdir()
        (tmp_path / ext / "lock").write_text("")
    (tmp_path / "a" / "main.cpp").write_text("int x;")
    assert kb_compile.remove_stale_locks(str(tmp_path)) == 2
    assert not (tmp_path / "a" / "lock").exists()
    assert (tmp_path / "a" / "main.cpp").exists()


def test_a_lock_held_by_a_live_builder_is_kept(tmp_path: Path) -> None:
    import subprocess
    import textwrap

    (tmp_path / "ext").mkdir()
    baton = tmp_path / "ext" / "lock"
    baton.write_text("")
    # Another process (a second run's worker) builds here: it took the build dir's lock and lives on.
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import sys, time
                sys.path.insert(0, {os.path.dirname(kb_compile.__file__)!r})
                import kb_compile
                kb_compile.remove_stale_locks({str(tmp_path)!r})
                open({str(baton)!r}, "w").close()  # its own torch baton, mid-build
                print("building", flush=True)
                time.sleep(60)
                """
            ),
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == b"building"
        assert kb_compile.remove_stale_locks(str(tmp_path)) == 0
        assert baton.exists(), "a live build's baton must stay"
    finally:
        holder.kill()
        holder.wait()
    # Its builder is dead now (the OS released its lock): the baton is stale and goes.
    assert kb_compile.remove_stale_locks(str(tmp_path)) == 1
    assert not baton.exists()


def test_capture_keeps_at_most_the_limit(tmp_path: Path) -> None:
    log = tmp_path / "flood.log"
    with kb_compile.capture_fds(str(log), limit=64 * 1024):
        for _ in range(4000):
            print("x" * 100)
        os.write(2, b"y" * 200_000)
    text = log.read_text()
    assert len(text) < 64 * 1024 + 200
    assert text.startswith("x" * 100)
    assert text.count("[krefine: output beyond 65536 bytes is dropped]") == 1


def test_capture_fds_catches_python_c_and_raw_fd_output(tmp_path: Path) -> None:
    log = tmp_path / "out.log"
    libc = ctypes.CDLL(None)
    with kb_compile.capture_fds(str(log)):
        print("from print")
        os.write(1, b"from os.write 1\n")
        os.write(2, b"from os.write 2\n")
        libc.printf(b"from printf without newline")
    text = log.read_text()
    for piece in ("from print", "from os.write 1", "from os.write 2", "from printf without newline"):
        assert piece in text


def test_load_ok_records_the_build_and_unloads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("TORCH_EXTENSIONS_DIR", "TORCH_CUDA_ARCH_LIST", "TORCH_USE_CUDA_DSA"):
        monkeypatch.setenv(name, "restored-after-the-test")
    source = "import torch.nn as nn\nprint('hello from import')\nclass ModelNew(nn.Module):\n    pass\n"
    build = tmp_path / "b"
    result = kb_compile.load_candidate(
        source, str(build), str(tmp_path / "c.log"), arch_list="9.0", record=True
    )
    assert result.ok and result.error_name is None and result.feedback == ""
    assert (build / "candidate.py").read_text() == source
    assert json.loads((build / kb_compile.BUILD_INFO_FILE).read_text())["arch_list"] == "9.0"
    assert os.environ["TORCH_EXTENSIONS_DIR"] == str(build)
    assert "hello from import" in (tmp_path / "c.log").read_text()
    assert result.module is not None and result.module.__file__ == str(build / "candidate.py")
    assert sys.modules[result.module.__name__] is result.module
    kb_compile.unload_candidate(result)
    assert result.module.__name__ not in sys.modules
    # A later import (the GPU worker's) reuses the recorded arch list, so ninja sees the same flags.
    kb_compile.load_candidate(source, str(build), str(tmp_path / "d.log"))
    assert os.environ["TORCH_CUDA_ARCH_LIST"] == "9.0"


def test_load_failures_are_classified_like_kernelbench(tmp_path: Path) -> None:
    cases = {
        "def broken(:\n": ("SyntaxError", kb_compile.SYNTAX_MESSAGE),
        "x = 1\n": ("SyntaxError", kb_compile.SYNTAX_MESSAGE),
        "import no_such_module_abc\n": (
            "builtins.ModuleNotFoundError",
            "No module named 'no_such_module_abc'",
        ),
        "import sys\nsys.exit(2)\n": ("builtins.SystemExit", "2"),
        "raise RuntimeError('Error building extension \\'e\\'')\n": (
            "builtins.RuntimeError",
            "Error building extension 'e'",
        ),
    }
    for index, (source, (name, error)) in enumerate(cases.items()):
        result = kb_compile.load_candidate(
            source, str(tmp_path / f"b{index}"), str(tmp_path / f"{index}.log")
        )
        assert not result.ok
        assert (result.error_name, result.error) == (name, error)
        assert result.feedback.startswith("Compilation failed")


def test_candidate_chdir_does_not_move_the_worker(tmp_path: Path) -> None:
    cwd = os.getcwd()
    source = f"import os\nos.chdir({str(tmp_path)!r})\nclass ModelNew:\n    pass\n"
    kb_compile.load_candidate(source, str(tmp_path / "b"), str(tmp_path / "l.log"))
    assert os.getcwd() == cwd
