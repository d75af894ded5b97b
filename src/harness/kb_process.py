"""The single-use candidate process: started ahead of need by the worker (`CandidateProcess`), it warms
up (thread pools, torch's extension module, then, once the worker allows it, its device context), waits
for one job, serves the worker's requests for it (kb_candidate's `serve`: load, trial calls, timed
calls, KernelBench's own loop in faithful mode, a profile) inside the sandbox, and exits.

Nothing inherited: the first thing a candidate process does is keep one descriptor that reaches the
worker, its end of the socket pair (moved to fd 3, spoken in kb_channel's frames), and close every
other descriptor it was born with: the forkserver's "alive" pipe (one byte written there ends the
server), the resource tracker's pipe, the pipe its job came through, whatever the preload opened. Its
standard input is the null device; its output goes to the worker log, which the orchestrator caps.
Each job gets a scratch folder of its own (created by the worker, removed after), which is its working
directory, home and temporary folder and the only folder besides its build it may write once confined.

Starting up is two steps because only the second touches the GPU: creating a CUDA context slows calls
timed meanwhile on the same device (on the H200, about one call in five by 0.3-1.5 ms for the 0.2-0.5 s
it takes), while the CPU step does not measurably. So a process does its CPU step at once, then asks
(`device?`) and waits until the worker grants it (`device`), which the worker does only while nothing
is being timed (kb_pool's Worker.grant_spares and settle_spares).

The forkserver starts from the harness folder (read-only in the sandbox), with `PYTHONSAFEPATH` and
`PYTHONNOUSERSITE` set: neither the working directory nor a user site folder is on its path, so a file a
candidate planted can never be imported by a server started after it (kb_pool restarts a dead one).
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import json
import multiprocessing.connection
import os
import signal
import sys
import time
from typing import Any

import torch

import kb_candidate
import kb_channel
import kb_memory
import kb_profile
import kb_tensors
import kb_timing
from kb_channel import Channel, ProtocolError

HARNESS_DIR = os.path.dirname(os.path.abspath(__file__))
# The process this module was imported in: a candidate process whose pid differs had it preloaded by
# the forkserver (see process_context).
_IMPORTED_IN = os.getpid()
# Set only while the forkserver starts: PYTHONPATH as it was before (JSON, null for unset).
_FORKSERVER_ENV = "KREFINE_FORKSERVER_PYTHONPATH"
# The descriptor a candidate process keeps: its channel to the worker.
CHANNEL_FD = 3
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
# Set to "1" in the worker's environment: candidate processes dumpable again (to tell whether a device
# or driver problem comes from their not being dumpable). Off by default.
DUMPABLE_ENV = "KREFINE_DUMPABLE_CANDIDATES"


def _restore_pythonpath() -> None:
    """In the forkserver, which imports this module as a preload: put PYTHONPATH and PYTHONSAFEPATH back
    as they were, so that candidate processes (forked from the server, with its environment) and what
    they start do not inherit the server's start-up settings."""
    saved = os.environ.pop(_FORKSERVER_ENV, None)
    if saved is not None:
        previous = json.loads(saved)
        _set_pythonpath(previous.get("PYTHONPATH"))
        _set_env("PYTHONSAFEPATH", previous.get("PYTHONSAFEPATH"))
        make_non_dumpable()


def _set_pythonpath(value: str | None) -> None:
    _set_env("PYTHONPATH", value)


def _set_env(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def make_non_dumpable() -> None:
    """No process of the same user may ptrace this one or read its memory through /proc (the worker,
    the forkserver and, inheriting it, every candidate process: a candidate must not reach a spare
    that will run the next one)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


_restore_pythonpath()


def _die_with_parent() -> None:
    """PR_SET_PDEATHSIG: the candidate process must not outlive its worker."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def keep_only_channel(conn: Any) -> Channel:
    """Close every descriptor but the channel (moved to fd 3) and stdout/stderr; stdin from the null
    device. Also forgets the descriptors multiprocessing noted in this process (the forkserver's alive
    pipe, the resource tracker's), so nothing tries to use a number that is now closed or reused."""
    fd = conn.fileno()
    if fd != CHANNEL_FD:
        os.dup2(fd, CHANNEL_FD, inheritable=False)
    conn._handle = None  # the old number is closed below; the Connection must not close it again later
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.closerange(CHANNEL_FD + 1, _max_fd())
    from multiprocessing import forkserver, process, resource_tracker

    forkserver._forkserver._forkserver_alive_fd = None  # type: ignore[attr-defined]
    forkserver._forkserver._inherited_fds = None  # type: ignore[attr-defined]
    resource_tracker._resource_tracker._fd = None  # type: ignore[attr-defined]
    resource_tracker._resource_tracker._pid = None  # type: ignore[attr-defined]
    process._parent_process = None  # type: ignore[attr-defined]
    return Channel(multiprocessing.connection.Connection(CHANNEL_FD))


def _max_fd() -> int:
    try:
        return max(int(os.sysconf("SC_OPEN_MAX")), 1024)
    except (ValueError, OSError):
        return 1 << 16


def open_descriptors() -> list[int]:
    """This process's open descriptors (for tests and the process's own report), without the one the
    listing itself used."""
    try:
        listed = sorted(int(name) for name in os.listdir("/proc/self/fd"))
    except OSError:
        return []
    found = []
    for fd in listed:
        try:
            os.fstat(fd)
        except OSError:
            continue
        found.append(fd)
    return found


def child_main(conn: Any, device_name: str, harness_dir: str) -> None:
    """Entry point of a candidate process: keep one channel, warm up, wait for one job, serve it, exit."""
    channel = keep_only_channel(conn)
    del conn
    _die_with_parent()
    # A session of its own: whatever this process (later, the candidate) starts carries it, however it
    # detaches, and the worker's sweep kills it (kb_pool).
    with contextlib.suppress(OSError):
        os.setsid()
    if os.environ.get(DUMPABLE_ENV) == "1":
        # A diagnosis switch only: candidate processes are not dumpable unless this is set.
        with contextlib.suppress(Exception):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
    if harness_dir not in sys.path:
        sys.path.insert(0, harness_dir)
    if device_name.startswith("cuda") and torch.cuda._is_in_bad_fork():
        # The server process touched CUDA after all: this process cannot use it. Say so; the worker
        # starts its candidate processes with spawn from then on.
        with contextlib.suppress(OSError):
            channel.send("bad_fork", pid=os.getpid())
        os._exit(0)
    device = kb_tensors.normalize_device(device_name)
    # Start the CPU thread pool now, so its threads are not the candidate's "new native threads".
    torch.ones(256, 256) @ torch.ones(256, 256)
    torch.ones(1 << 17).add_(1)
    importlib.import_module("torch.utils.cpp_extension")  # slow to import; every candidate load needs it
    flusher = kb_timing.L2Flusher()
    try:
        # The device step waits for the worker's grant (see the module doc).
        channel.send(
            "device?", pid=os.getpid(), preloaded=os.getpid() != _IMPORTED_IN, descriptors=open_descriptors()
        )
        channel.expect("device")
        if device.type == "cuda":
            torch.cuda.set_device(device)
            torch.empty(1, device=device)  # the CUDA context, before it is needed
            torch.cuda.synchronize(device)
        # What the process made to start (torch, the harness, its context) stays out of the collector's
        # walk: the job's collections (kb_memory.release_memory) see only what the job made.
        kb_memory.freeze_startup_objects()
        channel.send("ready", pid=os.getpid())
        kb_candidate.serve(channel, device, flusher, kb_profile.profile)
    except (EOFError, OSError, ProtocolError):  # the worker let this process go (shutdown, another device)
        pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def process_context(method: str) -> Any:
    """`forkserver` (the default): candidate processes fork from a server process that has imported
    torch and this module and never run a candidate or touched CUDA (fork is only unsafe after CUDA is
    initialised), so a new process costs milliseconds plus its own device context, not a torch import
    (seconds). The server is started (spawned) once per worker: a serving GPU worker starts it as it
    starts (kb_pool.Worker.start_early), any other on first use. `spawn`: the fallback when a forked
    process finds CUDA unusable (see child_main)."""
    import torch.multiprocessing as torch_mp

    if method == "spawn":
        return torch_mp.get_context("spawn")
    # torch.cuda.is_available() through NVML: the CUDA driver's device count would mark every process
    # forked afterwards as unable to use CUDA.
    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
    context = torch_mp.get_context("forkserver")
    # Not torch.utils.cpp_extension: importing it marks later forks as unable to use CUDA (seen on the
    # H100 with torch 2.11); each candidate process imports it after the fork, while it is a spare.
    context.set_forkserver_preload(PRELOAD)
    start_forkserver()
    return context


# What the forkserver imports once, so that a candidate process forked from it starts without
# importing torch (seconds) itself.
PRELOAD = ["kb_candidate", "kb_profile", "kb_process", "kb_sandbox"]


def start_forkserver() -> None:
    """Start the forkserver (if it is not running) from the harness folder, with the harness's folder
    on PYTHONPATH and no unsafe path entries (module doc). Before CPython 3.12.8 and 3.13.1
    (gh-117378) the server ignores the sys.path it is handed, so the preload failed without a word and
    every candidate process imported torch itself: 2.8 s of a 3.5 s start on the H200 (Python 3.12.3).
    The environment variable is the workaround CPython's fix names; the server takes it back out as it
    preloads this module (_restore_pythonpath)."""
    from multiprocessing import forkserver

    previous = os.environ.get("PYTHONPATH")
    previous_safe = os.environ.get("PYTHONSAFEPATH")
    saved_cwd = os.getcwd()
    os.environ["PYTHONPATH"] = os.pathsep.join([HARNESS_DIR, *([previous] if previous else [])])
    os.environ[_FORKSERVER_ENV] = json.dumps({"PYTHONPATH": previous, "PYTHONSAFEPATH": previous_safe})
    os.environ["PYTHONSAFEPATH"] = "1"
    os.environ["PYTHONNOUSERSITE"] = "1"
    try:
        os.chdir(HARNESS_DIR)
        forkserver.ensure_running()
    finally:
        os.chdir(saved_cwd)
        os.environ.pop(_FORKSERVER_ENV, None)
        _set_pythonpath(previous)
        _set_env("PYTHONSAFEPATH", previous_safe)


def forkserver_pid() -> int | None:
    from multiprocessing import forkserver

    pid: Any = getattr(forkserver._forkserver, "_forkserver_pid", None)
    return int(pid) if pid is not None else None


def forkserver_alive(settle_s: float = 0.0) -> bool:
    """Whether the forkserver this worker started is still running (None started: True). `settle_s`:
    how long a server that is dying (a signal sent, its exit not yet collected) may take to be seen dead."""
    pid = forkserver_pid()
    if pid is None:
        return True
    deadline = time.monotonic() + settle_s
    while True:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return False
        if done != 0:
            return False
        if time.monotonic() >= deadline:
            return True
        time.sleep(0.01)


class BadFork(Exception):
    """A forked candidate process cannot use CUDA (the server process initialised it)."""


class CandidateProcess:
    """A single-use candidate process, started ahead of need (see the module doc)."""

    def __init__(self, device: str, method: str = "forkserver") -> None:
        context = process_context(method)
        self.device = device
        conn, child = context.Pipe(duplex=True)
        self.channel = Channel(conn)
        # Not daemonic: a candidate may start processes of its own (daemons may not).
        self.process = context.Process(target=child_main, args=(child, device, HARNESS_DIR), name="krefine-candidate")
        self.started = time.perf_counter()
        self.process.start()
        child.close()
        # starting (its CPU step) -> asking (for the device step) -> granted -> ready -> busy
        self.state = "starting"
        # Whether the forkserver had preloaded the harness (known once it asks; see process_context).
        self.preloaded: bool | None = None
        # The descriptors the process held when it asked for its device step (kb_process's hygiene).
        self.descriptors: list[int] = []

    @property
    def pid(self) -> int | None:
        pid: int | None = self.process.pid
        return pid

    @property
    def ready(self) -> bool:
        return self.state == "ready"

    def _receive(self) -> None:
        """One start-up frame: `device?` after the CPU step, `ready` after the device step."""
        try:
            frame = self.channel.recv()
        except (EOFError, OSError) as exc:
            self.process.join(5)
            raise ChildDied(self.process.exitcode) from exc
        except ProtocolError as exc:
            raise RuntimeError(f"candidate process sent {exc} while starting") from None
        if frame.op == "bad_fork":
            self.process.join(5)
            raise BadFork()
        expected = {"starting": "device?", "granted": "ready"}.get(self.state)
        if frame.op != expected:
            raise RuntimeError(f"candidate process sent {frame.op!r} instead of {expected}")
        if expected == "device?":
            self.state, self.preloaded = "asking", bool(frame.get_bool("preloaded", optional=True))
            self.descriptors = [int(d) for d in frame.get_list("descriptors", optional=True) or [] if type(d) is int]
        else:
            self.state = "ready"

    def grant(self) -> bool:
        """Let the process take its device step if it has asked (without waiting for it); true if it
        was granted now. Raises ChildDied, BadFork or RuntimeError for a process that failed to start."""
        if self.state == "starting" and self.channel.poll(0):
            self._receive()
        if self.state != "asking":
            return False
        self.channel.send("device")
        self.state = "granted"
        return True

    def wait_ready(self) -> None:
        """Wait until the process is ready, granting its device step: call only while nothing is
        being timed on its device."""
        while self.state != "ready":
            if self.state == "asking":
                self.grant()
            else:
                self._receive()

    def kill(self) -> None:
        """End the process at once (SIGKILL); `join` waits for it to be gone."""
        with contextlib.suppress(Exception):
            self.process.kill()
        self.channel.close()

    def join(self, timeout: float = 10.0) -> None:
        with contextlib.suppress(Exception):
            self.process.join(timeout)


class ChildDied(Exception):
    """The candidate process ended without a result (a crash, os._exit, a signal)."""

    def __init__(self, exitcode: int | None) -> None:
        super().__init__(f"candidate process ended with exit code {exitcode}")
        self.exitcode = exitcode

    def reproduce(self) -> None:
        """End the worker the way its candidate ended, so the orchestrator reports it exactly as it
        did when candidates ran in the worker itself (exit code, signal, OOM killer)."""
        sys.stderr.flush()
        code = self.exitcode
        if code is not None and code < 0:
            signal.signal(-code, signal.SIG_DFL)
            os.kill(os.getpid(), -code)
            time.sleep(1)
            # Still here: PID 1 of the namespaces sandbox ignores its own signals. 128 + signal tells
            # the sandbox's supervisor to die of that signal instead.
            os._exit(128 - code)
        os._exit(code if code is not None and code > 0 else 1)


__all__ = ["BadFork", "CandidateProcess", "ChildDied", "kb_channel"]
