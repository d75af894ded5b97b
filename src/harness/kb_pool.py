"""The worker's pool of single-use candidate processes, and one job run through it.

`Worker` keeps what a worker holds between requests: the reference data (kb_reference's
ReferenceCache), strict reference timings, the L2 flusher, and the warm candidate processes
(kb_process) that take one job each. `run_candidate` runs one job (a candidate's evaluation, its strict
re-time, the reference's strict timing) in a fresh process, driven by kb_drive; the time the worker
spent on the reference meanwhile is booked as reference time. `profile_isolated` runs `op: profile` in
such a process.

One candidate must not reach the next. After its job, a candidate process is killed at once (it gets
no grace to linger), and before the next timed loop the worker waits until it is gone, frees what it
lent it, removes its scratch folder (and, before the next candidate starts, what it left in the worker's
own /dev/shm: kb_shm), and sweeps: every process descended from the worker that is not
the forkserver, its resource tracker, a spare or the job's own process, and that is not in the
worker's own session, is killed (a candidate process starts a session of its own before its job, so
whatever it forks carries that mark, however it detaches; the worker is a child subreaper, so such a
process, orphaned, is still the worker's descendant). A forkserver found dead after a job was killed
by that job's candidate, which is blamed (`harness_tampering`): the worker starts a new server from a
clean state and drops the spares forked from the old one. A forkserver that dies between jobs is
restarted, and a job whose process could not start because of it is started again, never failed.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

import kb_candidate
import kb_drive
import kb_feedback
import kb_process
import kb_shm
import kb_timing
from kb_channel import ProtocolError
from kb_correctness import Verdict, is_out_of_memory
from kb_exchange import Exchange
from kb_feedback import get_error_name
from kb_process import BadFork, CandidateProcess, ChildDied
from kb_reference import ProblemContext, ReferenceCache, select_device, tolerance

# Warm candidate processes kept per device. On a GPU three, and a replacement starts warming as soon
# as one is taken: a forked process needs about 0.4 s for its CPU step and 0.2-0.5 s for its CUDA
# context on the H200, a candidate about 0.8 s, so back-to-back candidates rarely wait. On the CPU one,
# started after a result so that warming never competes with a candidate being timed on the same cores.
SPARES = {"cuda": 3, "cpu": 1}
# How long settle_spares waits for one spare's device step (a CUDA context takes well under a second).
SPARE_START_TIMEOUT_S = 60.0
# How long the worker waits for a killed candidate process to be gone before a timed loop.
REAP_TIMEOUT_S = 30.0
# Starting a candidate process through a forkserver that just died: tries before giving up.
START_TRIES = 3
# Set (to anything) in the orchestrator's environment: one line per job in the worker's log saying where
# its time went (lease_trace).
LEASE_TRACE = "KREFINE_LEASE_TRACE"
PR_SET_CHILD_SUBREAPER = 36


class Retired:
    """A candidate process that has had its job: killed, then joined, its lent buffers freed and its
    scratch folder removed before anything else is timed."""

    def __init__(self, process: CandidateProcess, exchange: Exchange | None, scratch: str | None) -> None:
        self.process = process
        self.exchange = exchange
        self.scratch = scratch

    def collect(self, timeout: float) -> None:
        self.process.kill()
        self.process.join(timeout)
        if self.exchange is not None:
            self.exchange.close()
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)


class Worker:
    """State a worker keeps between requests (module doc). `isolate=False` starts no spares ahead of
    need (a worker that only prepares reference data)."""

    def __init__(self, isolate: bool = True) -> None:
        self.references = ReferenceCache()
        # Strict reference timings, keyed as ReferenceCache.ref_timings (reference_timing_key).
        self.strict_references: dict[tuple[Any, ...], dict[str, Any]] = {}
        self.flusher = kb_timing.L2Flusher()
        self.isolate = isolate
        self.spares: list[CandidateProcess] = []
        # Processes that had a job, to be collected before the next timed loop (Retired).
        self.retired: list[Retired] = []
        # The process running the current job (not a stray for the sweep).
        self.current: CandidateProcess | None = None
        # A candidate process that died: by default the worker ends the same way (see ChildDied).
        self.on_child_death = ChildDied.reproduce
        self.processes_started = 0
        self.warned_preload = False
        # Stray processes killed by sweeps (tests assert it; the log says it).
        self.strays_killed = 0
        # The sessions of the candidate processes that had a job (each starts its own: kb_process); what
        # runs in one of them after its job is a stray.
        self.candidate_sessions: set[int] = set()
        # Whether every process below this one is the worker's (PID 1 of its sandbox, or a serving worker,
        # `krefine_harness serve`): then a child in another session that it did not start is adopted
        # (an orphan) and a stray. Not in the harness's tests, where the worker shares its process tree.
        self.owns_tree = os.getpid() == 1
        # Forkservers restarted after one died (tests assert it).
        self.forkserver_restarts = 0
        # How candidate processes start: forked from a torch-preloaded server, or spawned (fallback).
        self.start_method = "forkserver"
        self.scratch_root = os.path.join(os.getcwd(), "candidates")
        # What candidates leave in the worker's own /dev/shm is removed before the next one starts (kb_shm).
        # Only as PID 1 of its sandbox does the worker have a /dev/shm of its own; a serving worker outside
        # one shares the machine's.
        self.shm = kb_shm.ShmSweeper(private=os.getpid() == 1)
        become_subreaper()

    # -- processes

    def take_process(self, device: str) -> tuple[CandidateProcess, float]:
        """A warm candidate process for `device` and how long we waited for it to be ready."""
        started = time.perf_counter()
        self.collect(wait=False)
        if self.shm.has_leftovers():
            # A file an earlier candidate left for this one: its writer, and whatever it started (which
            # could hold the file open), must be gone before it is removed.
            self.collect(wait=True)
            self.sweep()
            self.shm.after_candidates()
        self.grant_spares()  # nothing is timed between jobs: every spare that asked may take its device step
        while self.spares and (self.spares[0].device != device or not self.spares[0].process.is_alive()):
            self.spares.pop(0).kill()
        process = self.spares.pop(0) if self.spares else self._start(device)
        for attempt in range(START_TRIES):
            try:
                process.wait_ready()
                break
            except BadFork:
                self._forks_cannot_use_cuda()
                process = self._start(device)
            except (ChildDied, RuntimeError):
                # A process that died while starting (its forkserver died under it): start another.
                process.kill()
                if attempt == START_TRIES - 1:
                    raise
                self._restart_forkserver_if_dead()
                process = self._start(device)
        self.current = process
        if process.pid is not None:
            self.candidate_sessions.add(process.pid)  # the process started its own session (kb_process)
        return process, time.perf_counter() - started

    def grant_spares(self) -> None:
        """Let every spare that has finished its CPU step take its device step (kb_process's module
        doc). Called only where nothing is timed: between jobs, and while a job loads and is checked."""
        for process in list(self.spares):
            outcome = self._advance(process, process.grant)
            if outcome == "bad_fork":
                return
            if outcome == "ok" and process.preloaded is False:
                self._say_not_preloaded()

    def settle_spares(self) -> None:
        """Before every timed loop: wait until no spare is in its device step. A process creating its
        CUDA context slows calls timed meanwhile on the same GPU (on the H200, about one in five by
        0.3-1.5 ms); spares still in their CPU step are left alone, as they take their device step only
        when granted, and no grant is given until the timed job's result is in. A spare that does not
        finish its device step in SPARE_START_TIMEOUT_S is dropped."""
        for process in list(self.spares):
            if process.state != "granted":
                continue
            if not process.channel.poll(SPARE_START_TIMEOUT_S):
                # A spare that hangs while starting is dropped, not waited for: the loop it would stall
                # is a candidate's, whose timeout it must not become.
                self._drop(process)
            elif self._advance(process, process.wait_ready) == "bad_fork":
                return

    def before_timing(self) -> None:
        """Nothing but the job's own process may run when a loop is timed: earlier candidate processes
        gone, strays killed, no spare creating its CUDA context."""
        self.collect(wait=True)
        self.sweep()
        self.settle_spares()

    def _advance(self, process: CandidateProcess, step: Callable[[], object]) -> str:
        """One start-up step of a spare: "ok"; "dropped" (it failed to start: gone from the pool);
        "bad_fork" (forked processes cannot use CUDA: every spare is gone, spawned from now on)."""
        try:
            step()
        except BadFork:
            self._forks_cannot_use_cuda()
            return "bad_fork"
        except (ChildDied, RuntimeError, OSError):
            self._drop(process)
            return "dropped"
        return "ok"

    def _say_not_preloaded(self) -> None:
        """Once: a forked candidate process found nothing preloaded (kb_process.process_context)."""
        if self.start_method == "forkserver" and not self.warned_preload:
            self.warned_preload = True
            print(
                "krefine harness: candidate processes import torch themselves (the forkserver did not "
                "preload the harness); each starts seconds slower",
                file=sys.stderr,
            )

    def _drop(self, process: CandidateProcess) -> None:
        if process in self.spares:
            self.spares.remove(process)
        process.kill()

    def _forks_cannot_use_cuda(self) -> None:
        print("krefine harness: forked candidate processes cannot use CUDA; spawning them", file=sys.stderr)
        self.start_method = "spawn"
        _kill_all(self.spares)

    def start_early(self) -> None:
        """A serving GPU worker starts its forkserver (a process importing torch and the harness, about 2 s)
        as the worker starts, so that its first job's lease does not wait for it. Nothing touches a
        device: which one the first job names is not known yet."""
        if not (self.isolate and self.start_method == "forkserver"):
            return
        try:
            kb_process.process_context("forkserver")
        except Exception as exc:  # noqa: BLE001 - only speed is lost: the first job starts it, with its retries
            print(f"krefine harness: the forkserver did not start early ({exc}); the first job starts it", file=sys.stderr)

    def warm_spares(self, device: str) -> None:
        if not self.isolate:
            return
        self._restart_forkserver_if_dead()
        wanted = SPARES["cuda" if device.startswith("cuda") else "cpu"]
        while len(self.spares) < wanted:
            self.spares.append(self._start(device))
        self.grant_spares()

    def _start(self, device: str) -> CandidateProcess:
        for attempt in range(START_TRIES):
            try:
                self.processes_started += 1
                return CandidateProcess(device, self.start_method)
            except (ConnectionError, FileNotFoundError, EOFError, OSError):  # noqa: PERF203 - a retry loop
                # The forkserver died since it was last used (and is not yet known dead): start a new
                # one and try again; a job must not fail for krefine's own process.
                if attempt == START_TRIES - 1:
                    raise
                time.sleep(0.05 * (attempt + 1))
                self._restart_forkserver_if_dead(force=True)
        raise AssertionError("unreachable")

    def _restart_forkserver_if_dead(self, force: bool = False) -> bool:
        """A dead forkserver replaced by a new one (from kb_process.start_forkserver's clean state), its
        spares dropped. True when it was dead."""
        if kb_process.forkserver_alive() and not force:
            return False
        pid = kb_process.forkserver_pid()
        if pid is not None:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, 0)
        from multiprocessing import forkserver

        server: Any = forkserver._forkserver
        if server._forkserver_alive_fd is not None:
            with contextlib.suppress(OSError):
                os.close(server._forkserver_alive_fd)
        server._forkserver_address = None
        server._forkserver_alive_fd = None
        server._forkserver_pid = None
        _kill_all(self.spares)
        self.forkserver_restarts += 1
        print("krefine harness: the forkserver had died; started a new one", file=sys.stderr)
        if self.start_method == "forkserver":
            kb_process.start_forkserver()
        return True

    def retire(self, process: CandidateProcess, exchange: Exchange | None, scratch: str | None) -> None:
        """The job's process is done: it and everything it started are killed now (collected before the
        next timed loop)."""
        if process.pid is not None:
            for pid, _ in descendants_with_parents(process.pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        process.kill()
        if self.current is process:
            self.current = None
        self.retired.append(Retired(process, exchange, scratch))

    def collect(self, wait: bool) -> None:
        """Collect retired processes: all of them (`wait`: before a timed loop), or those already gone."""
        for retired in list(self.retired):
            if wait or not retired.process.process.is_alive():
                retired.collect(REAP_TIMEOUT_S)
                self.retired.remove(retired)

    def sweep(self) -> int:
        """Kill every stray process (module doc); returns how many were killed. Among the worker's
        descendants a stray is a process in a candidate process's session (everything a candidate forks
        stays in it unless it starts a session of its own), or in a session whose leader is gone (a
        daemon's double fork), or, where the worker is the root of its own process tree (PID 1 of its
        sandbox, or a serving worker), a child of the worker's in another session that the worker did not
        start (an orphan adopted by this subreaper). The worker's own helpers stay in its session."""
        known = {os.getpid()}
        known.update(p for p in (kb_process.forkserver_pid(), _tracker_pid()) if p is not None)
        known.update(p.pid for p in self.spares if p.pid is not None)
        if self.current is not None and self.current.pid is not None:
            known.add(self.current.pid)
        own_session = os.getsid(0)
        strays: list[int] = []
        for pid, ppid in descendants_with_parents(os.getpid()):
            if pid in known:
                continue
            try:
                session = os.getsid(pid)
            except (ProcessLookupError, PermissionError):
                continue
            if session == own_session:
                continue  # the worker's own helpers (input makers, header builds, ncu)
            adopted = self.owns_tree and ppid == os.getpid()
            leaderless = session != pid and not os.path.exists(f"/proc/{session}")
            if session in self.candidate_sessions or leaderless or adopted:
                strays.append(pid)
        killed = kill_and_reap(strays, "stray process(es) a candidate left behind")
        self.strays_killed += killed
        return killed

    def new_scratch(self) -> str:
        """A fresh folder for one job, named so that no earlier candidate could have guessed it."""
        os.makedirs(self.scratch_root, exist_ok=True)
        path = os.path.join(self.scratch_root, f"c-{secrets.token_hex(8)}")
        os.makedirs(path, mode=0o700)
        return path

    def close(self) -> None:
        _kill_all(self.spares)
        if self.current is not None:
            self.current.kill()
        for retired in self.retired:
            retired.process.kill()
        self.collect(wait=True)


def become_subreaper() -> None:
    """Orphans of this process's descendants become its children (kb_pool's sweep finds them)."""
    import ctypes

    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _tracker_pid() -> int | None:
    from multiprocessing import resource_tracker

    pid = resource_tracker._resource_tracker._pid  # type: ignore[attr-defined]
    return int(pid) if pid is not None else None


def descendants(root: int) -> list[int]:
    """Every process whose parent chain reaches `root` (read from /proc)."""
    return [pid for pid, _ in descendants_with_parents(root)]


def descendants_with_parents(root: int) -> list[tuple[int, int]]:
    """(pid, parent pid) of every process whose parent chain reaches `root` (read from /proc)."""
    children: dict[int, list[int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    for name in names:
        if not name.isdigit():
            continue
        state = proc_state(int(name))
        if state is not None:
            children.setdefault(state[1], []).append(int(name))
    found: list[tuple[int, int]] = []
    stack = [root]
    while stack:
        parent = stack.pop()
        for child in children.get(parent, []):
            found.append((child, parent))
            stack.append(child)
    return found


def kill_descendants_except(keep: set[int]) -> int:
    """SIGKILL every descendant of this process that is neither in `keep` nor below one of them; returns
    how many. A compile worker calls it after each compile child: nothing a candidate started at its
    import may outlive its compile (it could write into a later candidate's compile log, its feedback)."""
    me = os.getpid()
    # The worker's own helpers, whoever asks: its forkserver and multiprocessing's resource tracker.
    keep = keep | {p for p in (kb_process.forkserver_pid(), _tracker_pid()) if p is not None}
    pairs = descendants_with_parents(me)
    parent = dict(pairs)
    left: list[int] = []
    for pid, _ in pairs:
        ancestor = pid
        while ancestor != me and ancestor not in keep:
            ancestor = parent.get(ancestor, me)
        if ancestor not in keep:
            left.append(pid)
    return kill_and_reap(left, "process(es) a compile left behind")


def kill_and_reap(pids: list[int], what: str) -> int:
    """SIGKILL `pids` (descendants of this subreaper), say so, wait until they are gone and collect them;
    returns how many were killed."""
    killed: list[int] = []
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
    if killed:
        print(f"krefine harness: killed {len(killed)} {what}", file=sys.stderr)
        await_death(killed)
        reap_orphans()
    return len(killed)


def proc_state(pid: int) -> tuple[bytes, int] | None:
    """A process's state letter and parent pid from /proc/<pid>/stat; None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # pid (comm) state ppid ...: comm may hold spaces and parentheses; split after the last ')'.
    fields = stat[stat.rfind(b")") + 2 :].split()
    return (fields[0], int(fields[1])) if len(fields) > 1 else None


def await_death(pids: list[int], timeout: float = 2.0) -> None:
    """Wait (briefly) until killed processes have exited: a zombie holds no descriptor and no mapping, so
    what they held (a file in /dev/shm, say) is free for kb_shm's sweep."""
    deadline = time.monotonic() + timeout
    pending = list(pids)
    while pending and time.monotonic() < deadline:
        # Gone, or a zombie (Z, X): done.
        pending = [pid for pid in pending if (state := proc_state(pid)) is not None and state[0] not in (b"Z", b"X")]
        if pending:
            time.sleep(0.005)


def reap_orphans() -> None:
    """Collect exited children that no one waits for (killed strays reparented to this subreaper);
    children this process started itself are left to their owners (multiprocessing, subprocess)."""
    for pid in descendants(os.getpid()):
        if proc_state(pid) == (b"Z", os.getpid()):
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)


def _kill_all(processes: list[CandidateProcess]) -> None:
    while processes:
        processes.pop().kill()


# ------------------------------------------------------------------------------------------- jobs


def forbidden_message_verdict(message: str) -> Verdict:
    """The candidate's process sent the worker something the harness never sends: nothing of it ran
    here (kb_channel), the process is gone, and the candidate fails, in either mode (KernelBench's
    harness has no such channel to abuse)."""
    text = f"the candidate's process sent the worker a message the harness never sends: {message}"
    verdict = Verdict(status="runtime_error", compiled=True, correctness=False)
    verdict.metadata["runtime_error"] = text
    verdict.metadata["runtime_error_name"] = "forbidden_message"
    verdict.findings.append({"category": "forbidden_message", "severity": "error", "message": text})
    verdict.feedback.append(
        f"Integrity check failed: {text}. Candidates must not touch the harness's channel to the worker."
    )
    return verdict


def reference_error_verdict(error: kb_drive.ReferenceServingError) -> Verdict:
    """The reference (not the candidate) failed while the worker made data for the job; an
    out-of-memory error is marked so that kb_eval evaluates once more after freeing krefine's caches."""
    exc = error.exc
    print(f"krefine harness: {error}", file=sys.stderr)
    verdict = Verdict(status="reference_error", compiled=True, correctness=False)
    verdict.metadata["runtime_error"] = str(exc)
    verdict.metadata["runtime_error_name"] = get_error_name(exc)
    if is_out_of_memory(exc):
        verdict.metadata["reference_out_of_memory"] = True
    verdict.feedback.append(
        "The reference PyTorch Model itself failed on this machine (this is not your code's fault), "
        f"so the candidate cannot be checked.\n{kb_feedback.exception_line(exc)}"
    )
    return verdict


def tampering_verdict() -> Verdict:
    """The candidate killed the forkserver the worker starts candidate processes from."""
    text = (
        "the worker's process server died while this candidate ran: candidates must not signal, write to "
        "or otherwise touch processes of the harness"
    )
    verdict = Verdict(status="runtime_error", compiled=True, correctness=False)
    verdict.metadata["runtime_error"] = text
    verdict.metadata["runtime_error_name"] = "harness_tampering"
    verdict.findings.append({"category": "harness_tampering", "severity": "error", "message": text})
    verdict.feedback.append(f"Integrity check failed: {text}.")
    return verdict


def public_job(job: dict[str, Any], ctx: ProblemContext) -> dict[str, Any]:
    """The job as the candidate process gets it: what it needs to load and run, nothing secret."""
    atol, rtol = tolerance(ctx.precision, job.get("tolerance"))
    return {**job, "atol": atol, "rtol": rtol}


def run_candidate(
    worker: Worker, job: dict[str, Any], ctx: ProblemContext, key: int | None = None, every: bool = False
) -> Verdict:
    """Run a job in a fresh candidate process, driven by kb_drive. Time the worker spends on the
    reference meanwhile is booked as reference time. `key` fixes the strict inputs (the reference's
    cached timing), `every` checks every timed call."""
    reference_before, timing_before = ctx.build_seconds, ctx.timing_build_seconds
    started = time.perf_counter()
    process, waited = worker.take_process(job["device"])
    took = time.perf_counter()
    if job["device"].startswith("cuda"):
        # The replacement starts its CPU step now; its device step is granted while this job loads and
        # is checked, or after its result, never while it is timed (settle_spares, grant_spares).
        worker.warm_spares(job["device"])
    warmed = time.perf_counter()
    exchange = Exchange(ctx.device)
    scratch = worker.new_scratch()
    driver = kb_drive.Driver(
        process,
        ctx,
        {**public_job(job, ctx), "scratch": scratch},
        exchange,
        worker.flusher,
        between=worker.grant_spares,
        before_timing=worker.before_timing,
    )
    driver.spent.update(take=took - started, warm_spares=warmed - took)
    try:
        verdict = driver.run(key=key, every=every)
    except kb_drive.ForbiddenMessage as exc:
        verdict = forbidden_message_verdict(str(exc))
    except kb_drive.ReferenceServingError as exc:
        verdict = reference_error_verdict(exc)
    except kb_drive.ProcessSilent as exc:
        process.kill()
        verdict = Verdict(status="runtime_error", compiled=True, correctness=False)
        verdict.metadata["runtime_error"] = str(exc)
        verdict.metadata["runtime_error_name"] = "timeout"
        verdict.feedback.append(f"{exc}: it was ended.")
    except kb_drive.ProcessGone:
        process.join(10)
        died = ChildDied(process.process.exitcode)
        # A candidate process dies with its forkserver (PR_SET_PDEATHSIG): give a dying server the
        # moment its exit takes to show before deciding whose death this is.
        if kb_process.forkserver_alive(settle_s=1.0) and job["kind"] != "reference":
            worker.retire(process, exchange, scratch)
            print(f"krefine harness: {died}; ending the worker the same way", file=sys.stderr)
            worker.close()
            worker.on_child_death(died)
            raise died from None
        # The reference's own timing process (trusted code, no candidate in it), or a process that died
        # with its forkserver: not a candidate's crash to report the way the candidate died.
        verdict = Verdict(status="runtime_error", compiled=True, correctness=False)
        verdict.feedback.append(f"the job's process ended without a result ({died})")
    retiring = time.perf_counter()
    worker.retire(process, exchange, scratch)
    driver._spend("retire", retiring)
    if not kb_process.forkserver_alive():
        # Only the job's own process ran anything a candidate wrote while the server died.
        if job["kind"] != "reference":
            verdict = tampering_verdict()
        worker._restart_forkserver_if_dead()
    total = time.perf_counter() - started
    # Reference data built while the candidate waited for it: trials during its check, the timing
    # inputs during its timing. Booked as reference time, taken out of the phase it waited in.
    reference_in_loop = ctx.build_seconds - reference_before
    for_timing = min(reference_in_loop, ctx.timing_build_seconds - timing_before)
    verdict.phases["reference_s"] += reference_in_loop
    verdict.phases["correctness_s"] = max(0.0, verdict.phases["correctness_s"] - (reference_in_loop - for_timing))
    verdict.phases["timing_s"] = max(0.0, verdict.phases["timing_s"] - for_timing)
    measured = sum(verdict.phases[k] for k in ("load_s", "correctness_s", "timing_s", "reference_s"))
    # What isolation costs this candidate: waiting for a warm process, handing it the job and the
    # reference data, and its exit.
    verdict.phases["isolation_s"] = max(0.0, total - waited - measured)
    verdict.phases["spawn_wait_s"] = verdict.phases.get("spawn_wait_s", 0.0) + waited
    if os.environ.get(LEASE_TRACE):
        lease_trace(job, verdict, total, driver.spent)
    return verdict


def lease_trace(job: dict[str, Any], verdict: Verdict, total: float, spent: dict[str, float]) -> None:
    """One line in the worker's log per job (README, "Where a lease goes"): its phases and the worker's
    steps, in seconds. `process` is time spent waiting for the candidate's process, inside any step."""
    steps = " ".join(f"{k}={v:.3f}" for k, v in sorted(spent.items()))
    phases = " ".join(f"{k}={v:.3f}" for k, v in sorted(verdict.phases.items()))
    print(
        f"krefine harness: lease trace at={time.time():.3f} {job['kind']} {os.path.basename(job['build_dir'])} "
        f"{verdict.status} total={total:.3f} | {phases} | {steps}",
        file=sys.stderr,
    )


def profile_isolated(request: dict[str, Any], worker: Worker, scratch: str) -> dict[str, Any]:
    """`op: profile` in a fresh candidate process (the profile imports and runs the candidate)."""
    import kb_profile

    process, _ = worker.take_process(request["device"])
    folder = worker.new_scratch()
    # ncu is started from here, not from the confined candidate process: its injection needs, while
    # CUDA initialises in the profiled process, writes the confinement refuses; that process confines
    # itself once CUDA is up (kb_profile.ncu_target).
    job = {
        "kind": "profile",
        "mode": request.get("mode", "faithful"),
        "device": request["device"],
        "hardware": "",
        "build_dir": request["candidate"]["build_dir"],
        "scratch": folder,
        "settings": kb_candidate.settings_snapshot(),
    }
    try:
        process.channel.send("job", job=job)
        process.channel.send("profile", request={**request, "ncu_from_worker": True})
        frame = process.channel.expect("profiled")
        result: dict[str, Any] = frame.get_dict("result")
        process.channel.send("finish")
        with contextlib.suppress(Exception):
            process.channel.expect("bye")
    except (EOFError, OSError) as exc:
        process.join(10)
        died = ChildDied(process.process.exitcode)
        worker.retire(process, None, folder)
        worker.close()
        worker.on_child_death(died)
        raise died from exc
    except ProtocolError as exc:
        result = {"id": request["id"], "ok": True, "kind": "profile", "status": "error", "error": str(exc)}
    finally:
        worker.retire(process, None, folder)
        worker.warm_spares(request["device"])
    if result.get("status") == "ok" and kb_profile.profiler_of(request) != "torch":
        started = time.perf_counter()
        kb_profile.add_ncu(result, request, select_device(request), scratch)
        result["duration_s"] = round(result.get("duration_s", 0.0) + time.perf_counter() - started, 6)
    return result


__all__ = ["ReferenceCache", "Worker", "run_candidate"]
