"""kb_sandbox.enter_candidate: what a confined candidate process can and cannot do.

Each check runs the confinement in a fresh subprocess (it is irreversible) and reports what the
confined code could do as JSON.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

HARNESS = Path(__file__).resolve().parents[2] / "src" / "harness"
sys.path.insert(0, str(HARNESS))

import kb_sandbox  # noqa: E402 - after the harness folder is put on sys.path

ABI = kb_sandbox.landlock_abi()
needs_landlock = pytest.mark.skipif(ABI == 0, reason="this kernel has no Landlock")

CHILD = r"""
import json, os, signal, socket, sys
sys.path.insert(0, {harness!r})
import kb_sandbox

scratch, own_build, other_build, outside, port, target = {args!r}
result = {{"entered": kb_sandbox.enter_candidate(scratch, [own_build])}}

def attempt(name, fn):
    try:
        fn()
        result[name] = "ok"
    except OSError as e:
        result[name] = type(e).__name__

def write(path):
    with open(path, "w") as f:
        f.write("x")

attempt("write_scratch", lambda: write(os.path.join(scratch, "a.txt")))
attempt("mkdir_scratch", lambda: os.makedirs(os.path.join(scratch, "sub", "dir")))
attempt("write_own_build", lambda: write(os.path.join(own_build, "lock")))
attempt("write_other_build", lambda: write(os.path.join(other_build, "candidate.py")))
attempt("delete_other_build", lambda: os.remove(os.path.join(other_build, "model.so")))
attempt("write_outside", lambda: write(os.path.join(outside, "events.jsonl")))
attempt("read_outside", lambda: open(os.path.join(outside, "events.jsonl")).read())
attempt("dev_null", lambda: write("/dev/null"))
def connect():
    s = socket.create_connection(("127.0.0.1", port), timeout=2)
    s.close()
attempt("connect", connect)
attempt("signal_parent", lambda: os.kill(target, signal.SIGCONT))
print(json.dumps(result))
"""


def run_confined(tmp_path: Path, port: int, target: int) -> dict[str, Any]:
    scratch, own, other, outside = (tmp_path / n for n in ("scratch", "own", "other", "run"))
    for d in (scratch, own, other, outside):
        d.mkdir()
    (other / "candidate.py").write_text("original")
    (other / "model.so").write_text("original")
    (outside / "events.jsonl").write_text("original\n")
    args = (str(scratch), str(own), str(other), str(outside), port, target)
    code = CHILD.format(harness=str(HARNESS), args=args)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    assert (other / "candidate.py").read_text() == "original"
    assert (other / "model.so").exists()
    assert (outside / "events.jsonl").read_text() == "original\n"
    return result


@needs_landlock
def test_writes_only_beneath_scratch_and_own_build(tmp_path: Path) -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        r = run_confined(tmp_path, server.getsockname()[1], os.getpid())
    layers = r["entered"]["layers"]
    assert "no_new_privs" in layers
    assert any(layer.startswith("landlock-fs") for layer in layers)
    assert r["write_scratch"] == "ok"
    assert r["mkdir_scratch"] == "ok"
    assert r["write_own_build"] == "ok"
    assert r["dev_null"] == "ok"
    assert r["read_outside"] == "ok"  # reading stays allowed
    assert r["write_other_build"] == "PermissionError"
    assert r["delete_other_build"] == "PermissionError"
    assert r["write_outside"] == "PermissionError"


@pytest.mark.skipif(ABI < 4, reason="Landlock network rules need ABI 4")
def test_no_tcp_connect(tmp_path: Path) -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        r = run_confined(tmp_path, server.getsockname()[1], os.getpid())
    assert "landlock-net" in r["entered"]["layers"]
    assert r["connect"] == "PermissionError"


@pytest.mark.skipif(ABI < 6, reason="Landlock signal scoping needs ABI 6")
def test_cannot_signal_the_process_that_started_it(tmp_path: Path) -> None:
    got: list[int] = []
    previous = signal.signal(signal.SIGCONT, lambda *_: got.append(1))
    try:
        r = run_confined(tmp_path, 9, os.getpid())
        time.sleep(0.05)
    finally:
        signal.signal(signal.SIGCONT, previous)
    assert "landlock-scope" in r["entered"]["layers"]
    assert r["signal_parent"] == "PermissionError"
    assert got == []


def test_reports_layers_without_landlock(tmp_path: Path) -> None:
    """On a kernel without Landlock the function still returns (with no Landlock layer)."""
    code = (
        f"import sys; sys.path.insert(0, {str(HARNESS)!r}); import json, kb_sandbox\n"
        "kb_sandbox.landlock_abi = lambda: 0\n"
        f"print(json.dumps(kb_sandbox.enter_candidate({str(tmp_path)!r}, [])))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(out.stdout) == {"layers": ["no_new_privs"]}


def test_temporary_files_move_to_the_scratch_when_tmp_is_not_writable(tmp_path: Path) -> None:
    # gcc and ninja write temporary files under TMPDIR (default /tmp): confined, /tmp is not writable.
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    script = textwrap.dedent(
        f"""
        import os, sys, tempfile
        sys.path.insert(0, {str(HARNESS)!r})
        os.environ.pop("TMPDIR", None)
        import kb_sandbox
        kb_sandbox.enter_candidate({str(scratch)!r}, [])
        with tempfile.NamedTemporaryFile() as f:
            print(os.path.dirname(f.name))
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(scratch)
