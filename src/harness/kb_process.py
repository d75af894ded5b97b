"""The single-use candidate process: started ahead of need by the worker (`CandidateProcess`), it warms
up (device context, thread pools, torch's extension module), waits for one job, runs it (kb_candidate's
evaluate or re-time, strict mode's reference timing, or kb_profile's profile) inside the sandbox,
reports, and exits.

The worker side of the same pipe (answering the process's requests for reference data) is
kb_candidate's `serve_reference`; the worker's pool of these processes is kb_pool's `Worker`.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import importlib
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
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.empty(1, device=device)  # the CUDA context, before it is needed
        torch.cuda.synchronize(device)
    # Start the CPU thread pool now, so its threads are not the candidate's "new native threads".
    torch.ones(256, 256) @ torch.ones(256, 256)
    torch.ones(1 << 17).add_(1)
    importlib.import_module("torch.utils.cpp_extension")  # slow to import; every candidate load needs it
    flusher = kb_timing.L2Flusher()
    try:
        conn.send(("ready", os.getpid()))
    except OSError:  # the worker let this spare go (shutdown, another device): nothing to report
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
    context.set_forkserver_preload(["kb_candidate", "kb_profile", "kb_process", "kb_sandbox"])
    return context


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
        self.ready = False

    def wait_ready(self) -> None:
        if self.ready:
            return
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
        if message[0] != "ready":
            raise RuntimeError(f"candidate process sent {message[0]!r} instead of ready")
        self.ready = True

    def run(
        self,
        job: dict[str, Any],
        ctx: kb_reference.ProblemContext,
        before_timing: Callable[[], None] | None = None,
    ) -> dict[str, Any]:
        """Send the job, serve the reference until the result comes, let the process go. A message
        the harness does not send (kb_wire) ends the process at once and raises ForbiddenMessage.
        `before_timing` runs before the requests that start a timed loop (kb_candidate.serve_reference)."""
        self.conn.send(job)
        try:
            result = kb_candidate.serve_reference(self.conn, ctx, before_timing)
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
