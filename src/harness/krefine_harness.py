"""krefine's worker harness: compiles, checks, times and profiles model-written kernels.

    python -u krefine_harness.py serve --role compile|gpu --scratch DIR   # docs/worker-protocol.md
    python krefine_harness.py seeds [--seed 42] [--trials 5]              # correctness trial seeds

The Rust side writes this file and its sibling modules (kb_*.py) into one folder and starts `serve`.
Only the standard library is imported at module level: the protocol fds must be isolated before torch
(or any candidate) can write to fd 1.

No candidate code runs in this process. A compile runs in a child forked for it (a compile worker never
initialises CUDA, so the fork is safe: `cuda_available` is read through NVML); an evaluation or a
profile runs in a pre-warmed single-use process (kb_process) that holds one channel to this one.
Whatever a candidate patches, sets, starts or imports ends with its process. This process keeps only
its own folder and the interpreter's on sys.path, is not dumpable, and adopts orphans (kb_pool).

Floors. Every harness module sits on one floor; imports (at module level or inside a function) run down
the floors or along one, never up, and never in a circle. From the top:

    protocol   krefine_harness (this file: the serve loop) > kb_protocol (message shapes);
               kb_bench (`krefine bench compile`'s driver, a script)
    eval       kb_prepare (`op: prepare`) > kb_eval (`op: evaluate`: the reference's timing, the speedup
               guard, the response) > kb_pool (the worker's candidate processes, one job run in one,
               strays swept) > kb_drive (the worker's side of one job: drives the process, lends it
               data, times calls on its own clock, checks and judges) > kb_judge (what a process says
               of itself, validated before it enters a verdict)
    process    kb_process (the single-use candidate process: one channel, warm-up, one job, exit)
    profile    kb_profile (`op: profile`: torch.profiler table, ncu run)
    candidate  kb_candidate (the candidate process's side of a job: load, calls, KernelBench's own
               loop in faithful mode) > kb_strict (strict mode's secret inputs and check decisions,
               held by the worker) > kb_precision (precision against float64) > kb_correctness
               (KernelBench's correctness loop and comparison, the verdict)
    build      kb_compile (`op: compile`, import a candidate) > kb_build (the fast load_inline)
               > kb_pch (shared precompiled headers) > kb_split (a C++ extension in two units)
               > kb_cusplit (a CUDA extension's device and host units); kb_nvcc (the overlapped
               nvcc, a script the build runs)
    problem    kb_reference (the problem, its reference data, the device) > kb_memory (device memory:
               a problem's footprint, what a candidate needs beside the cache) > kb_tensors (values and
               devices: casts, moves, checksums and fingerprints of inputs, RNG state) > kb_store (the
               on-disk input store, a script the orchestrator runs off the lease) > kb_inputs (parallel
               input generation) > kb_problem (KernelBench's basics: seeds, loading, tensors)
    exchange   kb_exchange (the buffers the worker lends a candidate process: copies only)
    timing     kb_timing (KernelBench's timers, L2 flush)
    leaves     kb_feedback (feedback text, what a candidate's error is),
               kb_sandbox (confinement), kb_shm (the worker's /dev/shm swept between candidates), kb_ncu (Nsight Compute's CSV and its P feedback text),
               kb_channel (the one channel to a candidate process: typed, size-limited JSON frames);
               none imports a harness module

Read the table top to bottom, left to right: a module may import only modules named after it (`a > b`:
a imports b). tests/python/test_floors.py reads the table and checks every import against it.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import math
import os
import platform
import signal
import sys
import traceback
from collections.abc import Callable, Iterator
from typing import Any

HARNESS_DIR = os.path.dirname(os.path.abspath(__file__))
# Shared precompiled headers one compile may have its worker start (a child names what it missed;
# each a compiler run of 40-60 CPU-s, so a candidate cannot make its worker build many).
PCH_PER_COMPILE = 4


class ProtocolChannel:
    """Requests in, responses out, on private fds that candidate code does not know about."""

    def __init__(self, in_fd: int, out_fd: int) -> None:
        self._reader = open(in_fd, "rb", buffering=1 << 16, closefd=True)  # noqa: SIM115 - lives as long as the worker
        self._out_fd = out_fd

    def read_line(self) -> bytes | None:
        line = self._reader.readline()
        return line if line else None

    def write(self, message: dict[str, Any]) -> None:
        data = (encode_json(message) + "\n").encode("utf-8")
        view = memoryview(data)
        while view:  # os.write may write less than asked on a pipe
            written = os.write(self._out_fd, view)
            view = view[written:]


def encode_json(message: dict[str, Any]) -> str:
    """Strict JSON (serde rejects NaN/Infinity): non-finite floats become null."""
    try:
        return json.dumps(message, ensure_ascii=True, allow_nan=False)
    except ValueError:
        return json.dumps(_finite(message), ensure_ascii=True, allow_nan=False)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def isolate_stdio() -> ProtocolChannel:
    """Move the protocol to private fds: fd 1 then points at fd 2 (the worker log) and fd 0 at
    /dev/null, so neither a candidate's prints (Python or C) nor its reads can touch the protocol."""
    sys.stdout.flush()
    proto_out = os.dup(1)  # os.dup makes non-inheritable fds: ninja, nvcc and ncu never get them
    proto_in = os.dup(0)
    os.dup2(2, 1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    return ProtocolChannel(proto_in, proto_out)


def safe_path() -> None:
    """Only the harness folder and the interpreter's own folders on sys.path: not the working
    directory (`''`, where candidates may have written), not a user site folder. The forkserver, started
    later, starts with PYTHONSAFEPATH and PYTHONNOUSERSITE (kb_process.start_forkserver); the harness's
    own scripts (kb_pch, kb_nvcc, kb_store) still find their folder, as scripts do."""
    import site

    user_site = site.getusersitepackages() if hasattr(site, "getusersitepackages") else None
    cwd = os.getcwd()
    sys.path[:] = [p for p in sys.path if p and os.path.abspath(p) != cwd and p != user_site]
    if HARNESS_DIR not in sys.path:
        sys.path.insert(0, HARNESS_DIR)
    os.environ["PYTHONNOUSERSITE"] = "1"


def make_non_dumpable() -> None:
    """No process of the same user (a candidate that escaped its confinement) may ptrace the worker or
    read its memory, where strict mode's secrets and the expected outputs live."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE


def prepare_process(scratch: str) -> None:
    safe_path()
    make_non_dumpable()
    os.makedirs(scratch, exist_ok=True)
    os.chdir(scratch)  # candidates that write files write them here
    os.environ.setdefault("HOME", scratch)  # a scrubbed environment may lack it; caches need one
    # torch runs `ninja` from PATH; a virtual environment keeps it next to the interpreter.
    bin_dir = os.path.dirname(sys.executable)
    path = os.environ.get("PATH", "")
    if bin_dir not in path.split(os.pathsep):
        os.environ["PATH"] = bin_dir + (os.pathsep + path if path else "")


def error_response(request_id: int, kind: str, message: str) -> dict[str, Any]:
    return {"id": request_id, "ok": False, "kind": kind, "error": message}


def ready_message(role: str) -> dict[str, Any]:
    import torch

    device = None
    if role == "compile":
        # Ask NVML, not the CUDA driver: a process that called cuInit must not fork, and compile
        # workers fork a child per compile.
        os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
    # Only GPU workers touch the device: a compile worker must not create a CUDA context.
    if role == "gpu" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        device = {
            "name": props.name,
            "capability": [props.major, props.minor],
            "total_memory_bytes": int(props.total_memory),
        }
        uuid = getattr(props, "uuid", None)
        gpu_uuid = f"GPU-{uuid}" if uuid is not None else None
    else:
        gpu_uuid = None
    return {
        "id": 0,
        "ok": True,
        "kind": "ready",
        "role": role,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cuda_available": bool(torch.cuda.is_available()),
        "device": device,
        "pid": os.getpid(),
        "placement": placement(gpu_uuid, torch.version.cuda),
    }


def placement(gpu_uuid: str | None, cuda: str | None) -> dict[str, Any]:
    """Where this worker runs (host, Slurm job and step, GPU) and the toolchain builds depend on."""
    import socket

    return {
        "host": socket.gethostname(),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "slurm_step_id": os.environ.get("SLURM_STEP_ID"),
        "gpu_uuid": gpu_uuid,
        "toolchain": toolchain(cuda),
    }


def toolchain(cuda: str | None) -> str:
    """Machine, libc, C++ compiler and nvcc: what a build made on one node needs from another."""
    import shutil
    import subprocess

    def first_line(cmd: list[str], last: bool = False) -> str:
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=False).stdout
        except (OSError, subprocess.SubprocessError):
            return "none"
        lines = [line.strip() for line in out.splitlines() if line.strip()]
        return (lines[-1] if last else lines[0]) if lines else "none"

    cxx = os.environ.get("CXX") or shutil.which("c++") or "c++"
    nvcc_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    nvcc = shutil.which("nvcc") or (os.path.join(nvcc_home, "bin", "nvcc") if nvcc_home else None)
    libc = "-".join(platform.libc_ver())
    parts = [platform.machine(), libc, first_line([cxx, "--version"]), f"cuda {cuda}"]
    parts.append(first_line([nvcc, "--version"], last=True) if nvcc and os.path.exists(nvcc) else "nvcc none")
    return " | ".join(parts)


class Server:
    def __init__(self, role: str, scratch: str, channel: ProtocolChannel | None = None) -> None:
        import kb_eval

        self.role = role
        self.scratch = scratch
        self.worker = kb_eval.Worker()
        # A serving worker is the root of its own process tree: an adopted orphan in another session is a
        # candidate's stray (kb_pool.Worker.sweep).
        self.worker.owns_tree = True
        # Where `progress` notices go while an evaluate runs (None: not sent, as in unit tests).
        self.channel = channel
        self._pch: Any = None

    @property
    def pch(self) -> Any:
        if self._pch is None:
            import kb_pch

            self._pch = kb_pch.BackgroundPch()
        return self._pch

    def after_compile(self) -> None:
        """Nothing of a compile outlives it: every process it left (the compile child's descendants,
        orphaned to this subreaper) is killed, the background header builds (started here, trusted) kept;
        then what it left in this worker's own /dev/shm is removed (kb_shm)."""
        import kb_pool

        keep = {job.pid for job in self._pch.jobs.values()} if self._pch is not None else set()
        kb_pool.kill_descendants_except(keep)
        self.worker.shm.after_candidates()

    def build_wanted_pch(self, request: dict[str, Any], wanted: list[Any]) -> bool:
        """Build the shared precompiled headers the compile child missed, here, where no candidate code
        runs, for the next candidates (a failure to start one only costs speed). Not where the request
        says `pch_background: false`: the orchestrator leaves a run's headers to one sandboxed worker
        (each builds them in its own copy-on-write layer, 40-60 CPU-s a header; src/worker/build_cache.rs).
        Returns whether a build started (the response's `pch_started`)."""
        if not wanted or request.get("pch_background") is False:
            return False
        return self.start_pch_builds(request["build_dir"], wanted[:PCH_PER_COMPILE]) > 0

    def start_pch_builds(self, build_dir: str, wanted: list[Any]) -> int:
        """Start building each shared header `wanted` names (kb_pch.BackgroundPch.request: only those a
        trusted builder accepts, none already made or under way) for the cache of `build_dir`; logs
        what each did. How many started."""
        import kb_pch

        root = kb_pch.pch_root_for(build_dir)
        running = set(self.pch.jobs)
        for item in wanted:
            try:
                note = self.pch.request(root, item)
            except Exception as exc:  # noqa: BLE001 - a PCH is an optimisation
                note = f"could not start a precompiled header build: {type(exc).__name__}: {exc}"
            if note:
                print(f"krefine harness: {note}", file=sys.stderr, flush=True)
        return len(set(self.pch.jobs) - running)

    def warm_headers(self, request: dict[str, Any]) -> dict[str, Any]:
        """Build the shared headers a candidate with torch's default flags uses (kb_pch.warm_requests),
        here, where no candidate code has run, before the run's first candidates ask: waits for them up
        to `wait_s` and says how many it started and how many still build (published by the
        orchestrator when done). A header already made is not built again."""
        import kb_pch

        self.pch.poll()
        started = self.start_pch_builds(request["build_dir"], kb_pch.warm_requests())
        pending = self.pch.wait(timeout_s=float(request["wait_s"])) if self.pch.jobs else 0
        return {"id": request["id"], "ok": True, "kind": "warm_headers", "started": started, "pending": pending}

    def pch_starter(self, request: dict[str, Any], started: list[bool]) -> Callable[[Any], None]:
        """What a compile child's notice of a missed header does: start building it at once, while the
        child builds without it, so that it is ready for the builds after this one (started when the
        build had ended, 35-45 s into a cold batch, the next wave of builds missed it too). At most
        PCH_PER_COMPILE a compile; `started` gets whether each started one."""

        def missed(item: Any) -> None:
            if len(started) < PCH_PER_COMPILE:
                started.append(self.build_wanted_pch(request, [item]))

        return missed

    def handle_line(self, line: bytes) -> dict[str, Any]:
        import kb_protocol

        try:
            request = json.loads(line)
        except ValueError as exc:
            return error_response(0, "error", f"request is not JSON: {exc}")
        request_id = request.get("id", 0) if isinstance(request, dict) else 0
        request_id = request_id if isinstance(request_id, int) and not isinstance(request_id, bool) else 0
        op = request.get("op") if isinstance(request, dict) else None
        kind = op if isinstance(op, str) and op in kb_protocol.REQUEST_SHAPES else "error"
        problems = kb_protocol.check_request(request)
        if problems:
            return error_response(request_id, kind, "malformed request: " + "; ".join(problems[:5]))
        refusal = self.refusal(request)
        if refusal:
            return error_response(request_id, kind, refusal)
        try:
            return self.dispatch(request)
        except Exception as exc:  # noqa: BLE001 - a harness bug must not kill the worker silently
            details = traceback.format_exc()
            print(f"krefine harness: internal error on request {request_id}:\n{details}", file=sys.stderr)
            return error_response(request_id, kind, f"internal harness error: {type(exc).__name__}: {exc}")

    @contextlib.contextmanager
    def reference_progress(self, request_id: int) -> Iterator[None]:
        """While an evaluate runs, announce each stretch of reference work (building trial data or
        timing inputs the candidate asked for, timing the reference) with `progress` notices, so the
        orchestrator charges it to eval.timeouts.reference_s and not to the candidate's execute_s."""
        channel, references = self.channel, self.worker.references
        if channel is None:
            yield
            return

        def notify(active: bool) -> None:
            channel.write(
                {"id": request_id, "ok": True, "kind": "progress", "reference": "start" if active else "end"}
            )

        references.on_reference = notify
        try:
            yield
        finally:
            references.on_reference = None

    def refusal(self, request: dict[str, Any]) -> str | None:
        device = request.get("device")
        if self.role == "compile" and isinstance(device, str) and device.startswith("cuda"):
            return "a compile worker does not use the GPU; send evaluate/profile for cuda to a gpu worker"
        return None

    def dispatch(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request["op"]
        if op == "compile":
            self.pch.poll()
            started: list[bool] = []
            response, wanted = compile_in_child(request, self.pch_starter(request, started))
            self.after_compile()
            if self.build_wanted_pch(request, wanted) or any(started):
                response["pch_started"] = True
            return response
        if op == "warm_headers":
            return self.warm_headers(request)
        if op == "prepare":
            import kb_prepare

            return kb_prepare.prepare(request, self.worker)
        if op == "evaluate":
            import kb_eval

            with self.reference_progress(request["id"]):
                return kb_eval.evaluate(request, self.worker)
        if op == "profile":
            import kb_pool

            return kb_pool.profile_isolated(request, self.worker, self.scratch)
        if self._pch is not None:
            self._pch.stop()
        return {"id": request["id"], "ok": True, "kind": "shutdown"}


def compile_in_child(
    request: dict[str, Any], on_missed: Callable[[Any], None] | None = None
) -> tuple[dict[str, Any], list[Any]]:
    """Build and import the candidate in a child forked for this one compile, so that nothing its
    import does (patches, threads, a module named like the next candidate's) stays in the worker. A
    child that dies takes the worker with it the same way, as when compiles ran in the worker.

    The child writes a line for each shared precompiled header it misses, as it misses it
    (`on_missed` is called with it here, while the child builds on), then its result. Returns the
    response and the headers the child looked for and did not find. What the child writes is the
    candidate's to forge: a header request is checked by the worker (kb_pch.trusted_pch_request) and
    capped per compile."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: one compile, then exit without running any teardown
        code = 0
        try:
            os.close(read_fd)
            _die_with_parent()
            import kb_build
            import kb_compile
            import kb_sandbox

            # The shared precompiled headers are read-only here: a candidate must not plant a header
            # that later builds include. The worker builds the ones this child misses.
            kb_build.PCH_BUILDER = False

            def tell_missed(wanted: dict[str, Any]) -> None:
                os.write(write_fd, (encode_json({"pch_missed": wanted}) + "\n").encode("utf-8"))

            kb_build.PCH_MISSED = tell_missed
            writable = [request["build_dir"], os.path.dirname(request["log_path"]), os.getcwd()]
            # Confinement can only grant folders that exist, and the confined child may not create
            # them in their (read-only) parents: make them first.
            for folder in writable:
                os.makedirs(folder, exist_ok=True)
            kb_sandbox.enter_candidate(os.getcwd(), writable)
            response = kb_compile.handle_compile(request)
            data = (encode_json({"response": response, "pch_wanted": kb_build.PCH_WANTED}) + "\n").encode("utf-8")
            view = memoryview(data)
            while view:
                view = view[os.write(write_fd, view) :]
        except BaseException:  # noqa: BLE001 - the parent answers for a child without a result
            traceback.print_exc()
            code = 70
        sys.stderr.flush()
        os._exit(code)
    os.close(write_fd)
    chunks: list[bytes] = []
    with open(read_fd, "rb") as reader:
        for line in reader:
            notice = _pch_missed(line)
            if notice is None:
                chunks.append(line)
            elif on_missed is not None:
                on_missed(notice)
    _, status = os.waitpid(pid, 0)
    if chunks:
        message = json.loads(b"".join(chunks))
        wanted = message.get("pch_wanted")
        return message["response"], wanted if isinstance(wanted, list) else []
    if os.WIFSIGNALED(status):
        signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
        os.kill(os.getpid(), os.WTERMSIG(status))
        # Still here: PID 1 of the namespaces sandbox ignores its own signals; its supervisor turns
        # 128 + signal back into that signal.
        os._exit(128 + os.WTERMSIG(status))
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)


def _pch_missed(line: bytes) -> Any:
    """The header a compile child's line says it missed, or None when the line is not such a notice."""
    if not line.startswith(b'{"pch_missed"'):
        return None
    try:
        notice = json.loads(line)
    except ValueError:
        return None
    return notice.get("pch_missed") if isinstance(notice, dict) and len(notice) == 1 else None


def _die_with_parent() -> None:
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def serve(role: str, scratch: str) -> int:
    channel = isolate_stdio()
    prepare_process(os.path.abspath(scratch))
    import kb_protocol

    channel.write(ready_message(role))
    server = Server(role, os.path.abspath(scratch), channel)
    if role == "gpu":
        import kb_memory

        # Only the GPU worker: it collects after every evaluation, inside the lease; a compile worker
        # collects nothing per job. (Compiles that hung in CI with these changes were a compile child
        # forked while the CPU device's pause stopped and continued its session: src/worker/pause.rs.)
        kb_memory.freeze_startup_objects()
        server.worker.start_early()
    while True:
        line = channel.read_line()
        if line is None:
            return 0  # Rust closed stdin: leave quietly
        if not line.strip():
            continue
        response = server.handle_line(line)
        problems = kb_protocol.check_response(response)
        if problems:  # a harness bug; say so in the log, still answer
            print(f"krefine harness: response does not match the protocol: {problems}", file=sys.stderr)
        channel.write(response)
        if response.get("kind") == "shutdown" and response.get("ok"):
            return 0


def print_seeds(seed: int, trials: int) -> int:
    sys.path.insert(0, HARNESS_DIR)
    import kb_eval

    print(json.dumps(kb_eval.trial_seeds(seed, trials)))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="krefine_harness.py", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    serve_cmd = commands.add_parser("serve", help="answer JSON-line requests on stdin/stdout")
    serve_cmd.add_argument("--role", choices=["compile", "gpu"], required=True)
    serve_cmd.add_argument("--scratch", required=True, help="the worker's own scratch folder")
    seeds_cmd = commands.add_parser("seeds", help="print the correctness trial seeds as JSON")
    seeds_cmd.add_argument("--seed", type=int, default=42)
    seeds_cmd.add_argument("--trials", type=int, default=5)
    args = parser.parse_args(argv)
    if args.command == "serve":
        code = serve(args.role, args.scratch)
        # Skip interpreter teardown: candidate threads or CUDA teardown must not hang an exiting worker.
        sys.stderr.flush()
        os._exit(code)
    return print_seeds(args.seed, args.trials)


if __name__ == "__main__":
    sys.exit(main())
