"""The single-use candidate process: started ahead of need by the worker (`CandidateProcess`), it warms
up (thread pools, torch's extension module, then, once the worker allows it, its device context), waits
for one job, runs it (kb_candidate's evaluate or re-time, strict mode's reference timing, or
kb_profile's profile) inside the sandbox, reports, and exits.

Starting up is two steps because only the second touches the GPU: creating a CUDA context slows calls
timed meanwhile on the same device (on the H200, about one call in five by 0.3-1.5 ms for the 0.2-0.5 s
it takes), while the CPU step does not measurably. So a process does its CPU step at once, then asks
(`device?`) and waits until the worker grants it (`device`), which the worker does only while nothing
is being timed (kb_pool's Worker.grant_spares and settle_spares).

The worker side of the same pipe (answering the process's requests for reference data) is
kb_candidate's `serve_reference`; the worker's pool of these processes is kb_pool's `Worker`.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import importlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

import kb_candidate
import kb_native
import kb_profile
import kb_reference
import kb_tensors
import kb_timing
import kb_wire

HARNESS_DIR = os.path.dirname(os.path.abspath(__file__))
# The process this module was imported in: a candidate process whose pid differs had it preloaded by
# the forkserver (see process_context).
_IMPORTED_IN = os.getpid()
# Set only while the forkserver starts: PYTHONPATH as it was before (JSON, null for unset).
_FORKSERVER_ENV = "KREFINE_FORKSERVER_PYTHONPATH"


def _restore_pythonpath() -> None:
    """In the forkserver, which imports this module as a preload: put PYTHONPATH back as it was, so
    that candidate processes (forked from the server, with its environment) and what they start do not
    inherit the harness's folder on it."""
    saved = os.environ.pop(_FORKSERVER_ENV, None)
    if saved is not None:
        _set_pythonpath(json.loads(saved))


def _set_pythonpath(value: str | None) -> None:
    if value is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = value


_restore_pythonpath()


def _die_with_parent() -> None:
    """PR_SET_PDEATHSIG: the candidate process must not outlive its worker."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)


def child_main(conn: Any, device_name: str, harness_dir: str) -> None:
    """Entry point of a candidate process: warm up, wait for one job, run it, report, exit."""
    _die_with_parent()
    if harness_dir not in sys.path:
        sys.path.insert(0, harness_dir)
    if device_name.startswith("cuda") and torch.cuda._is_in_bad_fork():
        # The server process touched CUDA after all: this process cannot use it. Say so; the worker
        # starts its candidate processes with spawn from then on.
        conn.send(("bad_fork", os.getpid()))
        os._exit(0)
    device = kb_tensors.normalize_device(device_name)
    # Start the CPU thread pool now, so its threads are not the candidate's "new native threads".
    torch.ones(256, 256) @ torch.ones(256, 256)
    torch.ones(1 << 17).add_(1)
    importlib.import_module("torch.utils.cpp_extension")  # slow to import; every candidate load needs it
    flusher = kb_timing.L2Flusher()
    try:
        # The device step waits for the worker's grant (see the module doc).
        conn.send(("device?", os.getpid(), _IMPORTED_IN != os.getpid()))
        conn.recv()
        if device.type == "cuda":
            torch.cuda.set_device(device)
            torch.empty(1, device=device)  # the CUDA context, before it is needed
            torch.cuda.synchronize(device)
        conn.send(("ready", os.getpid()))
    except (EOFError, OSError):  # the worker let this spare go (shutdown, another device)
        os._exit(0)
    try:
        job = conn.recv()
    except (EOFError, OSError):
        os._exit(0)
    result = run_job(conn, job, flusher)
    del job
    gc.collect()  # drop shared tensors before reporting, so the worker may free them
    conn.send(("result", result))
    with contextlib.suppress(Exception):
        conn.recv()  # the worker's acknowledgement
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_job(conn: Any, job: dict[str, Any], flusher: kb_timing.L2Flusher) -> dict[str, Any]:
    """Pin the settings, enter the sandbox, then evaluate (or re-time, or profile) the candidate."""
    import kb_sandbox

    image = job.pop("native_timer", None)
    if image is not None:
        # Strict timing's native loop, loaded before the sandbox and before any candidate code (kb_native).
        with contextlib.suppress(kb_native.NativeTimerUnavailable):  # then strict timing reports it
            kb_native.load(image)
        del image
    kb_candidate.apply_settings(job["settings"])
    pinned = kb_candidate.settings_snapshot()
    torch.set_printoptions(precision=4, threshold=10, edgeitems=3, linewidth=80)  # as KernelBench's eval
    # Confinement only grants folders that exist (a stand-in candidate may come without a build).
    os.makedirs(job["build_dir"], exist_ok=True)
    sandbox = kb_sandbox.enter_candidate(os.getcwd(), [job["build_dir"], os.getcwd()])
    if job["kind"] == "profile":
        return kb_profile.profile(job["request"], kb_reference.ReferenceCache(), os.getcwd())
    ref = kb_candidate.RemoteReference(conn, job)
    runs = {"retime": kb_candidate.retime_candidate, "reference": kb_candidate.time_reference_job}
    verdict = runs.get(job["kind"], kb_candidate.evaluate_candidate)(job, ref, flusher, pinned)
    verdict.env["sandbox"] = sandbox
    verdict.env["pinned"] = pinned
    verdict.env["isolation"] = "process"
    return kb_candidate.verdict_to_wire(verdict)


def process_context(method: str) -> Any:
    """`forkserver` (the default): candidate processes fork from a server process that has imported
    torch and this module and never run a candidate or touched CUDA (fork is only unsafe after CUDA is
    initialised), so a new process costs milliseconds plus its own device context, not a torch import
    (seconds). The server is started (spawned) once per worker, on first use. `spawn`: the fallback
    when a forked process finds CUDA unusable (see child_main)."""
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
    _start_forkserver()
    return context


# What the forkserver imports once, so that a candidate process forked from it starts without
# importing torch (seconds) itself.
PRELOAD = ["kb_candidate", "kb_profile", "kb_process", "kb_sandbox"]


def _start_forkserver() -> None:
    """Start the forkserver (if it is not running) with the harness's folder on PYTHONPATH. Before
    CPython 3.12.8 and 3.13.1 (gh-117378) the server ignores the sys.path it is handed, so the preload
    failed without a word and every candidate process imported torch itself: 2.8 s of a 3.5 s start on
    the H200 (Python 3.12.3). The environment variable is the workaround CPython's fix names; the server
    takes it back out as it preloads this module (_restore_pythonpath)."""
    from multiprocessing import forkserver

    previous = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([HARNESS_DIR, *([previous] if previous else [])])
    os.environ[_FORKSERVER_ENV] = json.dumps(previous)
    try:
        forkserver.ensure_running()
    finally:
        os.environ.pop(_FORKSERVER_ENV, None)
        _set_pythonpath(previous)


class BadFork(Exception):
    """A forked candidate process cannot use CUDA (the server process initialised it)."""


class CandidateProcess:
    """A single-use candidate process, started ahead of need (see the module doc)."""

    def __init__(self, device: str, method: str = "forkserver") -> None:
        context = process_context(method)
        self.device = device
        self.conn, child = context.Pipe(duplex=True)
        # Not daemonic: a candidate may start processes of its own (daemons may not).
        self.process = context.Process(target=child_main, args=(child, device, HARNESS_DIR), name="krefine-candidate")
        self.started = time.perf_counter()
        self.finished: float | None = None
        self.process.start()
        child.close()
        # starting (its CPU step) -> asking (for the device step) -> granted -> ready
        self.state = "starting"
        # Whether the forkserver had preloaded the harness (known once it asks; see process_context).
        self.preloaded: bool | None = None

    @property
    def ready(self) -> bool:
        return self.state == "ready"

    def _receive(self) -> None:
        """One start-up message: `device?` after the CPU step, `ready` after the device step."""
        try:
            message = kb_wire.recv(self.conn)
        except (EOFError, OSError) as exc:
            self.process.join(5)
            raise ChildDied(self.process.exitcode) from exc
        if type(message) is not tuple or not message:
            raise RuntimeError(f"candidate process sent {message!r} instead of ready")
        if message[0] == "bad_fork":
            self.process.join(5)
            raise BadFork()
        expected = {"starting": "device?", "granted": "ready"}.get(self.state)
        if message[0] != expected:
            raise RuntimeError(f"candidate process sent {message[0]!r} instead of {expected}")
        if expected == "device?":
            self.state, self.preloaded = "asking", bool(message[2]) if len(message) > 2 else None
        else:
            self.state = "ready"

    def grant(self) -> bool:
        """Let the process take its device step if it has asked (without waiting for it); true if it
        was granted now. Raises ChildDied, BadFork or RuntimeError for a process that failed to start."""
        if self.state == "starting" and self.conn.poll(0):
            self._receive()
        if self.state != "asking":
            return False
        self.conn.send(("device",))
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

    def run(
        self,
        job: dict[str, Any],
        ctx: kb_reference.ProblemContext,
        between: Callable[[], None] | None = None,
        before_timing: Callable[[], None] | None = None,
    ) -> dict[str, Any]:
        """Send the job, serve the reference until the result comes, let the process go. A message
        the harness does not send (kb_wire) ends the process at once and raises ForbiddenMessage.
        `between` runs before each request until the job's first timed loop, `before_timing` before
        the requests that start one (kb_candidate.serve_reference)."""
        self.conn.send(job)
        try:
            result = kb_candidate.serve_reference(self.conn, ctx, before_timing, between)
        except (EOFError, OSError) as exc:
            self.process.join(10)
            raise ChildDied(self.process.exitcode) from exc
        except kb_wire.ForbiddenMessage:
            self.finished = time.perf_counter()
            self.kill()
            raise
        with contextlib.suppress(Exception):
            self.conn.send(("exit",))
        # It exits by itself now; the worker reaps it later (see Worker.reap), not on this path.
        self.finished = time.perf_counter()
        return result

    def kill(self) -> None:
        with contextlib.suppress(Exception):
            self.process.kill()
            self.process.join(5)
        with contextlib.suppress(Exception):
            self.conn.close()


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
