"""Building and importing a candidate (`op: compile`, and the load step of evaluate/profile).

A candidate is imported as a real module from `build_dir/candidate.py` (Triton-style decorators read
their source from the file). Its `load_inline` call does the nvcc/ninja build during the import; we
capture fds 1 and 2 at the OS level while it runs, so compiler output lands in the log even when the
candidate passes `verbose=True` (torch then writes ninja's output straight to fd 1). During the import
`load_inline` builds the fast way with the plain way as the fallback (`kb_build`); the compile step
records the path each extension took and later imports of the build replay it.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import hashlib
import importlib.util
import json
import os
import resource
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import kb_build
import kb_feedback
import kb_pch
from kb_feedback import CANDIDATE_ERRORS, get_error_name

CANDIDATE_FILE = "candidate.py"
BUILD_INFO_FILE = "krefine_build.json"
SYNTAX_MESSAGE = "Syntax error in custom generated code or ModelNew not found"
LOG_READ_LIMIT = 2 * 1024 * 1024
# What a candidate's import may write into its compile/load log; the rest is read and dropped with a
# note, so a candidate printing without end cannot fill the disk during its build's timeout.
CAPTURE_LIMIT = 8 * 1024 * 1024
# Room in the capture pipe (Linux' unprivileged maximum), so C code that prints a lot while holding
# the GIL (the pump thread needs it) does not block on a full pipe.
_PIPE_SIZE = 1024 * 1024
# How long the end of a capture waits for the pump: a process the candidate left behind may keep the
# pipe open for good.
_PUMP_JOIN_S = 5.0
# The harness's own threads in a candidate's process (capture pumps): the candidate checks leave them out.
# A pump may outlive its capture: the join's timeout is read on the process's clock, and a candidate that
# slows that clock (a GOT patch of clock_gettime) makes every such wait end at once.
HARNESS_THREADS: weakref.WeakSet[threading.Thread] = weakref.WeakSet()
# Held by the worker that builds or loads in a build dir (see remove_stale_locks); not torch's `lock`.
BUILD_LOCK_FILE = "krefine-build.lock"
_held_build_lock: tuple[str, int] | None = None
# What the worker was started with: when a request gives no arch list we fall back to this, never to
# "unset", so an operator-provided TORCH_CUDA_ARCH_LIST keeps working.
_STARTUP_ARCH_LIST = os.environ.get("TORCH_CUDA_ARCH_LIST")


def remove_stale_locks(build_dir: str) -> int:
    """Delete torch's `lock` batons under build_dir that no live build holds; returns how many.

    A worker killed mid-build leaves `<ext>/lock` behind and every later build of that extension would
    wait on it forever. A baton is stale only if its builder is dead: every worker that builds or loads
    in build_dir holds an exclusive `flock` on `build_dir/BUILD_LOCK_FILE` (taken here and kept until
    it moves on to another build dir or exits; the OS drops it when the process dies, however it
    dies). If another live process holds it (a second krefine run sharing the build cache, a worker
    left over from a killed run), its build may still be running: nothing is removed, and torch's
    baton makes this build wait for that one instead of racing it.
    """
    global _held_build_lock
    path = os.path.join(build_dir, BUILD_LOCK_FILE)
    if _held_build_lock is not None and _held_build_lock[0] == path:
        fd = _held_build_lock[1]
    else:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except PermissionError:
            # A published build is sealed read-only (its lock file too); flock needs no write access.
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError:
                return 0  # a sealed build without a lock file: nobody builds there any more
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return 0
        if _held_build_lock is not None:
            os.close(_held_build_lock[1])  # releases the previous build dir's lock
        _held_build_lock = (path, fd)
    removed = 0
    for baton in Path(build_dir).rglob("lock"):
        if baton.is_file():
            baton.unlink(missing_ok=True)
            removed += 1
    return removed


def _flush_all() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    # C code that printf()s without a newline leaves bytes in libc's buffer; flush them into the log
    # they belong to before we move fd 1 back.
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).fflush(None)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _pump(read_fd: int, log_fd: int, limit: int) -> None:
    """Copy the capture pipe into the log, keeping at most `limit` bytes; drain the rest."""
    written = 0
    noted = False
    try:
        while True:
            data = os.read(read_fd, 65536)
            if not data:
                return
            keep = data[: max(0, limit - written)]
            if keep:
                _write_all(log_fd, keep)
                written += len(keep)
            if len(keep) < len(data) and not noted:
                noted = True
                _write_all(log_fd, f"\n[krefine: output beyond {limit} bytes is dropped]\n".encode())
    except OSError:
        return
    finally:
        os.close(read_fd)
        os.close(log_fd)


@contextlib.contextmanager
def capture_fds(log_path: str, append: bool = False, limit: int = CAPTURE_LIMIT) -> Iterator[None]:
    """Point fds 1 and 2 at log_path for the duration (OS level: catches C, ninja and nvcc output).

    The output goes through a pipe and a pump thread that keeps at most `limit` bytes of it.
    """
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
    log_fd = os.open(log_path, flags, 0o644)
    read_fd, write_fd = os.pipe()
    with contextlib.suppress(OSError, AttributeError):
        fcntl.fcntl(write_fd, fcntl.F_SETPIPE_SZ, _PIPE_SIZE)
    pump = threading.Thread(target=_pump, args=(read_fd, log_fd, limit), name="krefine-capture", daemon=True)
    HARNESS_THREADS.add(pump)
    pump.start()
    _flush_all()
    saved_out, saved_err = os.dup(1), os.dup(2)
    saved_streams = sys.stdout, sys.stderr
    try:
        os.dup2(write_fd, 1)
        os.dup2(write_fd, 2)
        # Python-level prints go through sys.stdout/sys.stderr, which someone may have replaced (a test
        # runner, or the candidate itself); point them at the captured fds too.
        sys.stdout = open(1, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115 - the process's own streams
        sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115 - the process's own streams
        yield
    finally:
        _flush_all()
        sys.stdout, sys.stderr = saved_streams
        os.dup2(saved_out, 1)
        os.dup2(saved_err, 2)
        for fd in (saved_out, saved_err, write_fd):
            os.close(fd)
        # The pump ends when the last writer is gone; a process the candidate left running may hold
        # the pipe, so do not wait for it forever (its output stays capped).
        pump.join(_PUMP_JOIN_S)
        if not pump.is_alive() and pump.native_id is not None:
            _wait_gone(pump.native_id)


def _wait_gone(native_id: int, timeout_s: float = 1.0) -> None:
    """Wait until an ended thread of ours has left /proc/self/task: Python sees a thread stopped a
    moment before its OS thread exits, and the candidate checks count native threads (a pump still
    listed was once reported as a thread the candidate started)."""
    deadline = time.monotonic() + timeout_s
    while os.path.exists(f"/proc/self/task/{native_id}") and time.monotonic() < deadline:
        time.sleep(0.001)


def read_log(path: str) -> str:
    """A log's text; for huge logs (print floods) the head and the tail, where diagnostics live."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            if size <= 2 * LOG_READ_LIMIT:
                data = f.read()
            else:
                head = f.read(LOG_READ_LIMIT)
                f.seek(size - LOG_READ_LIMIT)
                data = head + b"\n... [log truncated] ...\n" + f.read()
    except OSError:
        return ""
    return data.decode("utf-8", errors="replace")


def _write_if_changed(path: Path, text: str) -> None:
    if not path.exists() or path.read_text(encoding="utf-8", errors="replace") != text:
        path.write_text(text, encoding="utf-8")


def _reset_extension_versions() -> None:
    """Forget which extensions this process built before.

    torch bumps an extension to `name_v1` when the same name is built again in one process with other
    sources. A persistent worker sees many candidates that reuse a name (each in its own build_dir), and
    the compile worker and the GPU worker must agree on the file name, so every import starts as in a
    fresh process.
    """
    from torch.utils import cpp_extension

    cpp_extension.JIT_EXTENSION_VERSIONER.entries.clear()


def _set_build_env(build_dir: str, arch_list: str | None) -> None:
    os.environ["TORCH_EXTENSIONS_DIR"] = build_dir
    os.environ["TORCH_USE_CUDA_DSA"] = "1"  # as KernelBench sets before loading
    chosen = arch_list if arch_list is not None else _STARTUP_ARCH_LIST
    if chosen is None:
        os.environ.pop("TORCH_CUDA_ARCH_LIST", None)
    else:
        os.environ["TORCH_CUDA_ARCH_LIST"] = chosen


def read_build_info(build_dir: str) -> dict[str, Any]:
    """What the compile step recorded about a build (`{}` when nothing usable is there)."""
    try:
        info = json.loads((Path(build_dir) / BUILD_INFO_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def _recorded_arch_list(build_dir: str) -> str | None:
    """The arch list the compile step used, so a later import sees the same ninja flags (no rebuild)."""
    value = read_build_info(build_dir).get("arch_list")
    return value if isinstance(value, str) else None


def _record_build(build_dir: str, arch_list: str | None, ctx: kb_build.BuildContext) -> None:
    import torch

    info = {
        "arch_list": arch_list,
        "torch": torch.__version__,
        "build_path": ctx.build_path(),
        "extensions": [b.to_json() for b in ctx.builds],
    }
    (Path(build_dir) / BUILD_INFO_FILE).write_text(json.dumps(info))


def module_name_for(build_dir: str) -> str:
    digest = hashlib.sha1(os.path.abspath(build_dir).encode()).hexdigest()[:16]
    return f"krefine_candidate_{digest}"


@dataclass
class LoadResult:
    """The outcome of importing a candidate. `error_name`/`error` are KernelBench's
    compilation_error_name/compilation_error when the load failed."""

    module: ModuleType | None
    model_new: type | None
    exc: BaseException | None
    error_name: str | None
    error: str | None
    feedback: str
    candidate_path: str
    log_path: str
    duration_s: float
    # Which way the extensions were built (`fast`, `plain`, `fallback:<why>`); None: none was built.
    build_path: str | None = None

    @property
    def ok(self) -> bool:
        return self.model_new is not None


def load_candidate(
    source: str,
    build_dir: str,
    log_path: str,
    arch_list: str | None = None,
    record: bool = False,
    build_mode: str = kb_build.FAST,
) -> LoadResult:
    """Write the source to build_dir/candidate.py and import it with fds captured into log_path.

    `record=True` (the compile op) builds in `build_mode` (`fast` falls back to `plain` on any error)
    and stores the arch list and build paths it used; otherwise the recorded ones are replayed so the
    import finds the compile step's build up to date.
    """
    started = time.perf_counter()
    build = os.path.abspath(build_dir)
    Path(build).mkdir(parents=True, exist_ok=True)
    remove_stale_locks(build)
    candidate_path = os.path.join(build, CANDIDATE_FILE)
    _write_if_changed(Path(candidate_path), source)
    _set_build_env(build, arch_list if record else _recorded_arch_list(build))
    _reset_extension_versions()
    ctx = kb_build.BuildContext(
        mode=build_mode,
        pch_root=kb_pch.pch_root_for(build),
        replay=None if record else kb_build.read_replay(read_build_info(build)),
    )
    name = module_name_for(build)
    sys.modules.pop(name, None)
    with kb_build.patched_load_inline(ctx):
        module, exc = _import_file(name, candidate_path, log_path)
    if record and exc is None:
        _record_build(build, arch_list, ctx)
    model_new = getattr(module, "ModelNew", None) if module is not None else None
    if exc is None and model_new is None:
        sys.modules.pop(name, None)
    error_name, error, feedback = _classify_load(exc, model_new, log_path, candidate_path, build)
    return LoadResult(
        module=module if model_new is not None else None,
        model_new=model_new,
        exc=exc,
        error_name=error_name,
        error=error,
        feedback=feedback,
        candidate_path=candidate_path,
        log_path=log_path,
        duration_s=time.perf_counter() - started,
        build_path=ctx.build_path(),
    )


def _import_file(name: str, path: str, log_path: str) -> tuple[ModuleType | None, BaseException | None]:
    cwd = os.getcwd()
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses and Triton look the module up while it executes
        with capture_fds(log_path):
            spec.loader.exec_module(module)
        return module, None
    except CANDIDATE_ERRORS as exc:
        sys.modules.pop(name, None)
        return None, exc
    finally:
        with contextlib.suppress(OSError):
            os.chdir(cwd)  # candidate code may chdir; the worker's scratch dir must stay put


def _classify_load(
    exc: BaseException | None, model_new: Any, log_path: str, candidate_path: str, build_dir: str
) -> tuple[str | None, str | None, str]:
    if exc is None and model_new is not None:
        return None, None, ""
    if exc is None or isinstance(exc, SyntaxError):
        # KernelBench's load returns None for both, and reports them with one fixed message.
        error_name, error = "SyntaxError", SYNTAX_MESSAGE
    else:
        error_name, error = get_error_name(exc), str(exc)
    log_text = read_log(log_path)
    feedback = kb_feedback.compile_feedback(error_name, exc, log_text, candidate_path, build_dir)
    return error_name, error, feedback


def unload_candidate(result: LoadResult) -> None:
    if result.module is not None:
        sys.modules.pop(result.module.__name__, None)


def handle_compile(request: dict[str, Any]) -> dict[str, Any]:
    """`op: compile`: build and import, report KernelBench-style error names and trimmed feedback."""
    mode = request.get("build") or kb_build.FAST
    if mode not in kb_build.BUILD_MODES:
        mode = kb_build.FAST
    cpu_before = cpu_seconds()
    result = load_candidate(
        request["source"],
        request["build_dir"],
        request["log_path"],
        request["arch_list"],
        record=True,
        build_mode=mode,
    )
    unload_candidate(result)
    return {
        "id": request["id"],
        "ok": True,
        "kind": "compile",
        "status": "ok" if result.ok else "compile_error",
        "error_name": result.error_name,
        "error": result.error,
        "feedback": result.feedback,
        "log_path": request["log_path"],
        "duration_s": round(result.duration_s, 6),
        "build_path": result.build_path,
        # The build's real core use is cpu_s / duration_s: the orchestrator's CPU budget claims it.
        "cpu_s": round(max(cpu_seconds() - cpu_before, 0.0), 6),
    }


def cpu_seconds() -> float:
    """CPU time of this worker and of its children that ended (ninja, and the compilers it waited
    for), user and system."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime
