"""The worker's side of one job in a candidate process: it drives, lends, times and judges.

kb_candidate's `Servant` answers in the candidate process; this module asks. A job (evaluate, strict
re-time, strict reference timing) runs as a sequence of frames over the process's one channel
(kb_channel), with every tensor the process gets lent as a copy (kb_exchange).

**Strict mode: the worker measures, the candidate only computes.** The candidate process owns its
whole address space (code pages, GOT, stack, threads, signals), so nothing it writes enters a verdict's
time or correctness:

- correctness trials: the worker lends a trial's inputs and RNG state and empty output buffers; the
  process runs forward and copies its output there; the worker copies it into private memory and
  compares it (KernelBench's shape check and tolerances) with the expected output, which never leaves
  the worker; the worker counts the trials that passed and writes the verdict;
- timing: per call, the worker makes fresh inputs from a secret seed in its own memory (kb_strict),
  flushes L2, poisons the output buffers, then reads its clock (t0), writes the inputs into the lent
  buffers (a device copy), synchronises, and sends `call`; the process runs forward, copies the output
  into the lent output buffers, synchronises its device and sends `done`; the worker copies the output
  into private memory, synchronises, and reads its clock (t1). The call costs t1 - t0. Why a candidate
  cannot shorten that span: the inputs exist nowhere it can read before t0 (they are written after it),
  and only the bytes the worker copied after `done`, before t1, are checked, so all input-dependent
  work that produced them lies inside [t0, t1]; work done later is not in the copy, and a `done` sent
  early only copies an unfinished output, which the checks fail (a call is checked with probability
  kb_strict.CHECK_SHARE, decided after t1 from a secret). What the span adds (the copies, two messages,
  two synchronisations) is the same for the reference, which is timed by this same loop in a process of
  its own, so code identical to the reference gets x1 up to noise; it is never subtracted (a candidate
  could overlap its work with any interval that is).
- precision: one more call on the problem's precision probe (kb_precision), judged against float64.

**Faithful mode: KernelBench's loop, then the worker's probes.** The process runs KernelBench's
correctness loop and CUDA-event timing itself (its comparison and its times are KernelBench's, taken as
KernelBench takes them), asking the worker for copies of the reference data (`ask`). Then the worker
times a few calls on fresh inputs with its own clock, every output checked: an output that does not
match (`fresh_output_mismatch`), or a KernelBench time well below what those calls took on the worker's
clock (`memo_suspected`: a memo, skipped work or a forged time), is a warning; so are the precision
probe's ratio and the side-stream probe (`stream_escape`).

A frame the harness never sends is a `ProtocolError`, which fails the candidate (`forbidden_message`).
"""

from __future__ import annotations

import functools
import os
import statistics
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

import kb_correctness
import kb_feedback
import kb_precision
import kb_strict
import kb_timing
from kb_candidate import NULL_CALL, rng_to_wire
from kb_channel import Frame, ProtocolError
from kb_correctness import Verdict
from kb_exchange import Exchange, to_wire
from kb_feedback import CANDIDATE_ERRORS
from kb_judge import add_findings, fail, findings_of, merge, verdict_from_process, warn
from kb_reference import ProblemContext, ReferenceFailure
from kb_tensors import nbytes, same_bytes

_perf_counter = time.perf_counter
_perf_counter_ns = time.perf_counter_ns

# Faithful mode's probes on the worker's clock: fresh calls (every output checked), and null calls (the
# whole hand-over, the copies and a device step in the process included, without a forward: on a GPU
# its two switches between the worker's and the process's CUDA contexts are most of it); what a null
# call may account for is capped, so a process that slows its own null calls cannot hide a forged time.
PROBE_CALLS = 3
PROBE_ROUNDS = 3
# On the CPU a round that looks forged is taken again after a pause, up to PROBE_ROUNDS_CPU rounds: there
# a burst of other work on the machine (a build) slows every call handed over in one moment, and a pause
# lets the next round sample another moment. A forged time stays forged in every round, so it is still
# warned (at a cost of the pauses, paid only by candidates that look forged).
PROBE_ROUNDS_CPU = 5
ROUND_PAUSE_S = 0.25
NULL_CALLS = 5
NULL_CAP_MS = 0.5
# A KernelBench time below what the fastest fresh call took on the worker's clock (less the worker's own
# copies and the hand-over) by more than MEMO_SHARE of that plus MEMO_SLACK_MS is `memo_suspected`. On
# a kernel of a few microseconds the hand-over is most of a call and varies by more than the kernel, so
# the slack keeps those silent (the GPU quickstart's honest turns). The CPU's margins are wider: there a
# call handed over after a pause wakes the thread pool again, which under load took milliseconds more
# than KernelBench's back-to-back calls of the same honest kernel.
MEMO_SHARE = {"cuda": 0.2, "cpu": 0.5}
MEMO_SLACK_MS = {"cuda": 0.2, "cpu": 5.0}
# A fresh call also holds what KernelBench's loop never does: the process copying its output into the
# worker's buffers. The worker copies the same bytes out of those buffers right after (its `read`), so
# the fastest of those reads stands for it; on a large output it is most of the gap (an honest 1 GB
# conv output: 0.6-1.1 ms on an H200, which warned the reference itself). What a process can hide
# there (work fused into its copy, or the worker's reads slowed by its own work between calls) is at
# most one copy of its output at this rate (bytes a second); strict mode's clock spans the whole call.
COPY_BACK_FLOOR_BPS = {"cuda": 1e12, "cpu": 2e9}
# Strict timing's warm-up: KernelBench's calls, then more until this much time has gone by (at most
# WARMUP_MAX_CALLS more), for the candidate and the reference alike.
WARMUP_MS = 50.0
WARMUP_MAX_CALLS = 1000
# The side-stream probe: a device-wide wait this much longer than the stream's events saw.
ESCAPE_SHARE = 0.15
ESCAPE_MIN_MS = 0.05
# The precision probe's calls (the faster of PRECISION_CALLS) much slower than the timed calls: the
# candidate may branch on its inputs. Wider on the CPU, where single calls vary with the machine's load.
PRECISION_CALLS = 2
SPECIALISED_RATIO = {"cuda": 1.5, "cpu": 3.0}
SPECIALISED_SLACK_MS = {"cuda": 0.05, "cpu": 2.0}


# How long the worker waits for one frame when KREFINE_FRAME_TIMEOUT_S is set (tests); unset, forever.
FRAME_TIMEOUT_S = float(os.environ["KREFINE_FRAME_TIMEOUT_S"]) if os.environ.get("KREFINE_FRAME_TIMEOUT_S") else None


class Call(NamedTuple):
    """One call on the worker's clock: its span (ms), the output's private copy, the reply, the worker's
    own copies within the span (ms: the inputs written, the output read), and the read alone (ms)."""

    span: float
    got: Any
    reply: Frame
    copies: float
    read: float


def memo_bound(fresh_ms: float, hand_over_ms: float, copy_back_ms: float, kind: str) -> float:
    """The least KernelBench time (ms) an honest candidate reports whose fastest fresh call took
    `fresh_ms` on the worker's clock (its own copies out): less the hand-over and the process's copy of
    its output into the worker's buffers, which KernelBench's loop never does, less MEMO_SHARE of that
    and MEMO_SLACK_MS (module doc)."""
    return (fresh_ms - hand_over_ms - copy_back_ms) * (1.0 - MEMO_SHARE[kind]) - MEMO_SLACK_MS[kind]


class ForbiddenMessage(Exception):
    """The candidate's process sent a frame the harness never sends."""


class ProcessGone(Exception):
    """The candidate's process ended (or closed its channel) in the middle of a job."""


class ProcessSilent(Exception):
    """The candidate's process sent nothing for FRAME_TIMEOUT_S (only where that is set)."""


class ReferenceServingError(Exception):
    """The reference failed while the worker made data for the job (not the candidate's fault)."""

    def __init__(self, what: str, exc: BaseException) -> None:
        super().__init__(f"the reference failed while making {what}: {type(exc).__name__}: {exc}")
        self.exc = exc


def serve_with_room(ctx: Any, what: str, make: Callable[[], Any]) -> Any:
    """`make()` (reference work for the job: trial data, inputs, expected outputs). A CUDA out-of-memory
    error makes krefine's own caches give way (other problems' reference data on the device) and `make`
    runs once more; a failure then is a ReferenceServingError. A trial whose reference forward failed
    (ReferenceFailure) passes through: KernelBench reports it as the reference's."""
    try:
        return make()
    except ReferenceFailure:
        raise
    except CANDIDATE_ERRORS as exc:
        if ctx.device.type != "cuda" or not kb_correctness.is_out_of_memory(exc):
            raise ReferenceServingError(what, exc) from None
    ctx.cache.evict_others(ctx)
    try:
        return make()
    except ReferenceFailure:
        raise
    except CANDIDATE_ERRORS as exc:
        raise ReferenceServingError(what, exc) from None


# ------------------------------------------------------------------------------------------ driver


class Driver:
    """One job in one candidate process (module doc). `between` runs between frames while nothing is
    timed (the worker's spares take their device step then); `before_timing` before a timed loop."""

    def __init__(
        self,
        process: Any,
        ctx: ProblemContext,
        job: dict[str, Any],
        exchange: Exchange,
        flusher: kb_timing.L2Flusher,
        between: Callable[[], None] | None = None,
        before_timing: Callable[[], None] | None = None,
    ) -> None:
        self.process = process
        self.channel = process.channel
        self.ctx = ctx
        self.job = job
        self.exchange = exchange
        self.flusher = flusher
        self.between = between or (lambda: None)
        self._before_timing = before_timing or (lambda: None)
        self.timing = False
        # Set once the job's first timed loop begins: from then until its result no spare may take its
        # device step (kb_pool.Worker.grant_spares), as creating a CUDA context slows calls timed meanwhile.
        self.timed_once = False
        self.atol, self.rtol = float(job["atol"]), float(job["rtol"])
        # Lent inputs of the faithful trial in progress, with the pristine ones they were copied from.
        self._lent_trial: tuple[int, int, Any, list[Any]] | None = None
        # Spans of the timed calls on the worker's clock (ms), for the precision probe's comparison.
        self.spans: list[float] = []
        self.env: dict[str, Any] = {}
        # Seconds by step of the job on the worker's side (waiting for the process, answering its asks,
        # the probes, the callbacks): kb_pool's lease trace, a diagnosis of where a lease goes.
        self.spent: dict[str, float] = {}

    def _spend(self, step: str, started: float) -> None:
        self.spent[step] = self.spent.get(step, 0.0) + (_perf_counter() - started)

    def before_timing(self) -> None:
        started = _perf_counter()
        self._before_timing()
        self._spend("before_timing", started)

    # -- frames

    def send(self, op: str, **fields: Any) -> None:
        try:
            self.exchange.announce(self.channel)
            self.channel.send(op, **fields)
        except OSError as exc:  # the process closed its end, or broke the stream (its own doing)
            raise ProcessGone(str(exc)) from exc

    def recv(self, *ops: str) -> Frame:
        """The process's next frame, one of `ops`; faithful mode's `ask` frames are answered on the way."""
        while True:
            waited = _perf_counter()
            if FRAME_TIMEOUT_S is not None and not self.channel.poll(FRAME_TIMEOUT_S):
                # The orchestrator owns every deadline (it ends the worker); a worker run without one
                # (the harness's own tests) gives up on a silent process after this long.
                raise ProcessSilent(f"the candidate's process sent nothing for {FRAME_TIMEOUT_S:g} s")
            try:
                frame: Frame = self.channel.recv()
            except (EOFError, OSError) as exc:
                raise ProcessGone() from exc
            except ProtocolError as exc:
                raise ForbiddenMessage(str(exc)) from None
            self._spend("process", waited)
            if frame.op == "ask" and self.job["mode"] == "faithful":
                # Faithful mode lends copies of reference data on request; strict mode serves none (the
                # worker drives every call there), so an `ask` is a frame the harness never sends.
                answering = _perf_counter()
                self._answer(frame)
                self._spend("ask_" + frame.get_str("what", limit=32), answering)
                continue
            if frame.op not in ops:
                raise ForbiddenMessage(f"a {frame.op!r} frame where {' or '.join(ops)} was due")
            return frame

    def exchange_frame(self, op: str, reply: str, **fields: Any) -> Frame:
        if not self.timing and not self.timed_once:
            started = _perf_counter()
            self.between()
            self._spend("between", started)
        self.send(op, **fields)
        try:
            frame: Frame = self.recv(reply)
        except ProtocolError as exc:
            raise ForbiddenMessage(str(exc)) from None
        return frame

    # -- the job

    def run(self, key: int | None = None, every: bool = False) -> Verdict:
        job = self.job
        public = {k: v for k, v in job.items() if k not in ("problem_code",)}
        self.send("job", job=public)
        verdict = Verdict(metadata={"hardware": job["hardware"], "device": str(self.ctx.device)})
        started = _perf_counter()
        init = serve_with_room(self.ctx, "the init inputs", self.ctx.init_inputs)
        loaded = self.exchange_frame("load", "loaded", init=self.exchange.lend("init", init))
        verdict.phases["load_s"] = _perf_counter() - started
        try:
            fragment = verdict_from_process(loaded.raw("verdict"), full=False)
            ok = loaded.get_bool("ok")
        except ProtocolError as exc:
            raise ForbiddenMessage(str(exc)) from None
        if not ok:
            if fragment.status == "correct":  # a load that failed without saying how
                fragment.status = "runtime_error"
                fragment.feedback.append("the candidate did not load")
            merge(verdict, fragment)
            verdict.status = fragment.status
            verdict.compiled = fragment.compiled
            return self.finish(verdict)
        add_findings(verdict, fragment.findings)
        verdict.feedback.extend(fragment.feedback)
        kind = job["kind"]
        if kind == "reference":
            verdict.status, verdict.correctness = "correct", True
            self.time_calls(verdict, kb_strict.StrictSession(self.ctx, every=every, key=key, tolerance=(self.atol, self.rtol)))
        elif kind == "retime":
            verdict.status, verdict.correctness = "correct", True
            self.time_calls(verdict, kb_strict.StrictSession(self.ctx, every=True, tolerance=(self.atol, self.rtol)))
        elif job["mode"] == "strict":
            self.strict(verdict)
        else:
            self.faithful(verdict)
        return self.finish(verdict)

    def finish(self, verdict: Verdict) -> Verdict:
        try:
            bye = self.exchange_frame("finish", "bye")
            env = bye.get_dict("env", optional=True) or {}
            self.env = {k: env[k] for k in ("sandbox", "pinned", "isolation") if k in env}
        except (ForbiddenMessage, ProcessGone, ProtocolError):
            self.env = {}
        verdict.env.update(self.env)
        return verdict

    # -- strict mode

    def strict(self, verdict: Verdict) -> None:
        started = _perf_counter()
        try:
            passed = self.strict_trials(verdict)
        except ReferenceFailure as failure:
            verdict.phases["correctness_s"] = _perf_counter() - started
            verdict.reference_failure = (self.job["trials"], failure.index)
            return
        verdict.phases["correctness_s"] = _perf_counter() - started
        if passed is None:
            verdict.correctness = False
            return
        trials = self.job["trials"]
        verdict.correctness = passed == trials
        verdict.metadata["correctness_trials"] = f"({passed} / {trials})"
        verdict.feedback.append(
            kb_feedback.correctness_summary(passed, trials, self.ctx.precision, self.atol, self.rtol)
        )
        if not verdict.correctness:
            verdict.status = "incorrect"
            return
        verdict.status = "correct"
        if not self.checks(verdict, "after the correctness trials"):
            return
        if self.job["timing"]["measure"]:
            self.time_calls(verdict, kb_strict.StrictSession(self.ctx, tolerance=(self.atol, self.rtol)))
        if verdict.status == "correct":
            self.precision(verdict, strict=True)

    def checks(self, verdict: Verdict, phase: str) -> bool:
        reply = self.exchange_frame("check", "checked", phase=phase)
        try:
            fragment = verdict_from_process(reply.raw("verdict"), full=False)
            ok = reply.get_bool("ok")
        except ProtocolError as exc:
            raise ForbiddenMessage(str(exc)) from None
        add_findings(verdict, fragment.findings)
        verdict.feedback.extend(fragment.feedback)
        if not ok:
            verdict.status, verdict.correctness = "incorrect", False
            verdict.metadata.update({k: v for k, v in fragment.metadata.items() if k.startswith("integrity_")})
        return bool(ok)

    def strict_trials(self, verdict: Verdict) -> int | None:
        """KernelBench's correctness loop, judged here: the number of trials passed, or None when the loop
        stopped early (verdict filled in). Raises ReferenceFailure when the reference failed a trial."""
        ctx, trials = self.ctx, self.job["trials"]
        mismatches: list[kb_feedback.Mismatch] = []
        passed = 0
        for index, seed in enumerate(ctx.trial_seeds(trials)):
            label = f"in correctness trial {index + 1} of {trials}"
            data = serve_with_room(ctx, "a trial's data", functools.partial(ctx.trial, trials, index, seed))
            inputs = self.exchange.lend("inputs", data.inputs)
            out_wire, out_views = self.exchange.slots("out", data.output)
            self.exchange.fill(out_views, float("nan"))
            reply = self.exchange_frame(
                "trial", "trial_done", index=index, trials=trials, seed=seed, inputs=inputs, out=out_wire,
                rng=rng_to_wire(data.rng),
            )
            try:
                if reply.raw("verdict") is not None:
                    merge(verdict, verdict_from_process(reply.raw("verdict"), full=False))
                    return None
                add_findings(verdict, findings_of(reply.raw("findings")))
            except ProtocolError as exc:
                raise ForbiddenMessage(str(exc)) from None
            if self._inputs_modified(verdict, data.inputs, label):
                return None
            mismatch = reply.get_str("mismatch", optional=True, limit=32)
            if mismatch is not None:
                self._output_mismatch(verdict, mismatch, reply, label)
                return None
            got = self.exchange.read(out_views)
            compared = kb_correctness.compare_trial(data.output, got, self.atol, self.rtol, index, sliced=True)
            if compared.shapes is not None:  # the process copied, then claims nothing: shapes are ours
                self._output_mismatch(verdict, "shape", reply, label)
                return None
            if compared.passed:
                passed += 1
                continue
            verdict.metadata.setdefault("max_difference", []).append(f"{compared.max_diff:.6f}")
            verdict.metadata.setdefault("avg_difference", []).append(f"{compared.avg_diff:.6f}")
            verdict.metadata["correctness_issue"] = "Output mismatch"
            if compared.detail is not None:
                mismatches.append(compared.detail)
        verdict.feedback.extend(kb_feedback.mismatch_sentences(mismatches, trials))
        return passed

    def _inputs_modified(self, verdict: Verdict, pristine: list[Any], label: str) -> bool:
        """Strict mode: the candidate got copies; any change to them fails the candidate."""
        lent = self.exchange.lent("inputs")
        changed = [i for i, (a, b) in enumerate(zip(pristine, lent, strict=False)) if not same_bytes(a, b)]
        if not changed:
            return False
        names = ", ".join(str(i) for i in changed)
        verdict.status, verdict.correctness = "incorrect", False
        verdict.metadata["correctness_issue"] = f"Input modified in place: input {names}"
        verdict.metadata["correctness_issue_name"] = "input_modified"
        verdict.feedback.append(
            f"Your ModelNew modified its input tensor(s) {names} in place {label}. Strict mode requires "
            "inputs to stay unchanged: write results into new output tensors."
        )
        return True

    def _output_mismatch(self, verdict: Verdict, kind: str, reply: Frame, label: str) -> None:
        got = reply.get_str("got", optional=True, limit=200) or "?"
        expected = reply.get_str("expected", optional=True, limit=200) or "?"
        verdict.status, verdict.correctness = "incorrect", False
        if kind == "shape":
            message = f"Output shape mismatch: Expected {expected}, got {got}"
            verdict.metadata["correctness_issue"] = message
            verdict.metadata["correctness_issue_name"] = "correctness_issue"
            verdict.feedback.append(f"Output shape mismatch {label}: expected {expected}, got {got}.")
            return
        message = f"Output {kind} mismatch: Expected {expected}, got {got}"
        verdict.metadata["correctness_issue"] = message
        verdict.metadata["correctness_issue_name"] = "correctness_issue"
        verdict.feedback.append(f"Output {kind} mismatch {label}: expected {expected}, got {got}.")

    # -- timed calls (strict timing, the reference's strict timing, re-times)

    def _fresh(self, session: kb_strict.StrictSession, n: int) -> list[Any]:
        made: list[Any] = serve_with_room(self.ctx, "fresh inputs", lambda: session.make(n))
        return made

    def _like(self, inputs: list[Any]) -> Any:
        return serve_with_room(self.ctx, "the output's shape", lambda: output_like(self.ctx, inputs))

    def _check(self, session: kb_strict.StrictSession, inputs: list[Any], got: Any, calls: int) -> str | None:
        problem: str | None = serve_with_room(
            self.ctx, "an expected output", lambda: session.check(inputs, got, calls)
        )
        return problem

    def _bind(self, inputs: list[Any], like: Any) -> tuple[Any, Any]:
        """Lend input and output buffers shaped as `inputs` and `like` and tell the process to run its
        calls on them: (input views, output views)."""
        # The same buffers as the trials' (one set of inputs and one of outputs lent at a time): a problem
        # with inputs of gigabytes must not hold several copies on the device.
        in_wire, in_views = self.exchange.slots("inputs", inputs, values=True, keep_strides=True)
        out_wire, out_views = self.exchange.slots("out", like)
        self.exchange_frame("bind", "bound", inputs=in_wire, out=out_wire)
        return in_views, out_views

    def _call(self, n: int, inputs: list[Any], in_views: Any, out_views: Any) -> Call:
        """One call on the worker's clock (module doc)."""
        self.exchange.fill(out_views, float("nan"))
        self.exchange.synchronize()
        t0 = _perf_counter_ns()
        self.exchange.write(in_views, inputs)
        t1 = _perf_counter_ns()
        self.send("call", n=n)
        reply = self.recv("done")
        t2 = _perf_counter_ns()
        if reply.raw("n") != n:
            raise ForbiddenMessage(f"a reply to call {reply.raw('n')!r} where call {n} was due")
        got = self.exchange.read(out_views)
        t3 = _perf_counter_ns()
        return Call((t3 - t0) / 1e6, got, reply, ((t1 - t0) + (t3 - t2)) / 1e6, (t3 - t2) / 1e6)

    def time_calls(self, verdict: Verdict, session: kb_strict.StrictSession) -> None:
        """The worker-clock timing loop (module doc) into `verdict.runtime_stats`; a failed check or a
        call that raised fails the candidate."""
        timing = self.job["timing"]
        calls = int(timing["trials"]) + int(timing["discard_first"])
        discard = int(timing["discard_first"])
        cuda = self.ctx.device.type == "cuda"
        flush = cuda and bool(timing["l2_flush"])
        started = _perf_counter()
        try:
            self.before_timing()
            self.timing = self.timed_once = True
            if timing["warmup"] and not self._warm_up(verdict, session, int(timing["warmup"])):
                return
            first = self._fresh(session, 0)
            like = self._like(first)
            in_views, out_views = self._bind(first, like)
            spans: list[float] = []
            for n in range(calls):
                inputs = first if n == 0 else self._fresh(session, n)
                if not self.exchange.same_values(in_views, inputs):
                    in_views, out_views = self._bind(inputs, self._like(inputs))
                if flush:
                    self.flusher.flush(self.ctx.device)
                span, got, reply, _, _ = self._call(n, inputs, in_views, out_views)
                if reply.raw("verdict") is not None or reply.raw("mismatch") is not None:
                    self._call_failed(verdict, reply)
                    return
                spans.append(span)
                problem = self._check(session, inputs, got, calls)
                del got
                if problem is not None:
                    self._timed_mismatch(verdict, n + 1, problem)
                    return
            self.spans = spans[discard:]
            verdict.runtime_stats = kb_timing.runtime_stats(self.spans)
            verdict.metadata["strict_timing"] = {
                **kb_strict.regime(self.ctx, timing, session.every),
                "checked": session.checked,
            }
        finally:
            self.timing = False
            verdict.phases["timing_s"] = _perf_counter() - started
            session.close()

    def _warm_up(self, verdict: Verdict, session: kb_strict.StrictSession, count: int) -> bool:
        """KernelBench's warm-up calls, then more until WARMUP_MS of them have run (the same for the
        candidate and the reference: a process that has just started would otherwise time its first
        calls at the device's idle clocks). False when a warm-up call failed (verdict filled in)."""
        warm = self._fresh(session, -1)
        wire = self.exchange.lend("inputs", warm)
        started = _perf_counter()
        reply = self.exchange_frame("warmup", "warm", inputs=wire, count=count)
        spent_ms = (_perf_counter() - started) * 1000.0
        if reply.raw("verdict") is None and spent_ms < WARMUP_MS:
            per_call = max(spent_ms / count, 1e-3)
            more = min(WARMUP_MAX_CALLS, int((WARMUP_MS - spent_ms) / per_call) + 1)
            reply = self.exchange_frame("warmup", "warm", inputs=wire, count=more)
        if reply.raw("verdict") is not None:
            self._call_failed(verdict, reply)
            return False
        return True

    def _call_failed(self, verdict: Verdict, reply: Frame) -> None:
        try:
            wire = reply.raw("verdict")
            if wire is not None:
                fragment = verdict_from_process(wire, full=False)
            else:
                fragment = Verdict(status="incorrect")
                kind = reply.get_str("mismatch", limit=32)
                got = reply.get_str("got", optional=True, limit=200)
                expected = reply.get_str("expected", optional=True, limit=200)
                fragment.feedback.append(f"In a timed call the output's {kind} was {got}, expected {expected}.")
                fragment.metadata["correctness_issue"] = f"Output {kind} mismatch in a timed call"
                fragment.metadata["correctness_issue_name"] = "timed_output_mismatch"
        except ProtocolError as exc:
            raise ForbiddenMessage(str(exc)) from None
        if fragment.status in ("runtime_error", "out_of_memory") and self.job["kind"] == "evaluate":
            # KernelBench keeps correctness when timing raises; only the runtime stays -1.
            verdict.metadata["error_during_performance"] = fragment.metadata.get("runtime_error", fragment.status)
            verdict.feedback.extend(fragment.feedback)
            verdict.runtime_stats = {}
            return
        merge(verdict, fragment)
        verdict.runtime_stats = {}

    def _timed_mismatch(self, verdict: Verdict, call: int, problem: str) -> None:
        verdict.status, verdict.correctness = "incorrect", False
        verdict.runtime_stats = {}
        verdict.metadata["correctness_issue"] = f"Output mismatch in timed call {call}"
        verdict.metadata["correctness_issue_name"] = "timed_output_mismatch"
        verdict.feedback.append(
            f"Strict timing checks the outputs of timed calls, each on fresh inputs: in timed call {call} "
            f"{problem}. The output must be computed from the inputs on every call (no caching across calls, "
            "no work left running after forward returns)."
        )

    # -- precision

    def precision(self, verdict: Verdict, strict: bool) -> None:
        """One call on the problem's precision probe (kb_precision), on the worker's clock."""
        probe = serve_with_room(self.ctx, "the precision probe", lambda: kb_precision.probe_for(self.ctx))
        record: dict[str, Any] = probe.summary()
        verdict.metadata["precision"] = record
        if probe.inputs is None:
            return
        was_timing = self.timing
        self.timing = True
        spans: list[float] = []
        ratio = 0.0
        kind = self.ctx.device.type
        typical = statistics.median(self.spans) if self.spans else None
        try:
            in_views, out_views = self._bind(probe.inputs, probe.expected)
            # A probe slower than the timed calls is measured again (up to PROBE_ROUNDS rounds;
            # PROBE_ROUNDS_CPU, after pauses, on the CPU; the fastest call kept), as a forged-looking
            # figure is: a machine's load passes, a path the candidate takes on other inputs does not.
            # (Three rounds back to back on a CI machine's two busy cores warned an honest candidate.)
            for round_ in range(PROBE_ROUNDS_CPU if kind == "cpu" else PROBE_ROUNDS):
                if round_ and kind == "cpu":
                    time.sleep(ROUND_PAUSE_S)
                for _ in range(PRECISION_CALLS):
                    span, got, reply, _, _ = self._call(-1, probe.inputs, in_views, out_views)
                    if reply.raw("verdict") is not None or reply.raw("mismatch") is not None:
                        record["ratio"] = None
                        warn(
                            verdict,
                            "precision_lowered",
                            "the candidate failed on the precision probe's inputs (signed values)",
                        )
                        return
                    spans.append(span)
                    ratio = max(ratio, kb_precision.ratio(probe, got))
                if strict and ratio >= kb_precision.FAIL_RATIO:
                    break  # refused below: no need to time it further
                if typical is None or min(spans) <= SPECIALISED_RATIO[kind] * typical + SPECIALISED_SLACK_MS[kind]:
                    break
        finally:
            self.timing = was_timing
        span = min(spans)
        record["ratio"] = ratio
        message = (
            f"on inputs with signed values the output is {ratio:.0f} times further from a float64 reference than "
            f"the reference's own (float32) output is: the candidate computes at a lower precision (TF32, fp16 or "
            "bf16 arithmetic) than the reference"
        )
        if strict and ratio >= kb_precision.FAIL_RATIO:
            fail(verdict, "precision_lowered", message)
            return
        if ratio >= kb_precision.WARN_RATIO:
            warn(verdict, "precision_lowered", message)
        if typical is not None and span > SPECIALISED_RATIO[kind] * typical + SPECIALISED_SLACK_MS[kind]:
            warn(
                verdict,
                "distribution_specialised",
                f"a call on the precision probe's inputs took {span:.3f} ms on the worker's clock, the timed "
                f"calls {typical:.3f} ms (median): the candidate may take another path on other inputs",
            )

    # -- faithful mode

    def faithful(self, verdict: Verdict) -> None:
        reply = self.exchange_frame("faithful", "faithful_done")
        try:
            result = verdict_from_process(reply.raw("verdict"), full=True)
        except ProtocolError as exc:
            raise ForbiddenMessage(str(exc)) from None
        verdict.status, verdict.compiled, verdict.correctness = result.status, result.compiled, result.correctness
        verdict.metadata.update(result.metadata)
        verdict.feedback.extend(result.feedback)
        verdict.sticky, verdict.oom_request_bytes = result.sticky, result.oom_request_bytes
        verdict.runtime_stats = result.runtime_stats
        verdict.reference_failure = result.reference_failure
        add_findings(verdict, result.findings)
        for key in ("correctness_s", "timing_s"):
            verdict.phases[key] = result.phases.get(key, 0.0)
        if verdict.status != "correct" or verdict.sticky or not verdict.correctness:
            return
        probes = [(self.fresh_probe, "fresh_probe")] if verdict.runtime_stats else []
        if verdict.runtime_stats and self.ctx.device.type == "cuda":
            probes.append((self.escape_probe, "escape_probe"))
        for probe, step in [*probes, (lambda v: self.precision(v, strict=False), "precision_probe")]:
            started = _perf_counter()
            probe(verdict)
            self._spend(step, started)

    def _answer(self, frame: Frame) -> None:
        """Faithful mode: the process's request for reference data, answered with copies."""
        what = frame.get_str("what", limit=32)
        ctx = self.ctx
        if what == "trial":
            trials, index, seed = frame.get_int("trials"), frame.get_int("index"), frame.get_int("seed")
            if not 0 <= index < trials or trials != self.job["trials"] or seed != ctx.trial_seeds(trials)[index]:
                raise ForbiddenMessage("a trial the job does not have")
            try:
                data = serve_with_room(ctx, "a trial's data", lambda: ctx.trial(trials, index, seed))
            except ReferenceFailure:
                self.send("answer", reference_failed=True)
                return
            inputs = self.exchange.lend("inputs", data.inputs)
            alias = _alias_of(data.output, data.inputs)
            expected = {"t": "alias", "input": alias} if alias is not None else self.exchange.lend("expected", data.output)
            self._lent_trial = (trials, index, data.inputs, self.exchange.lent("inputs"))
            self.send("answer", inputs=inputs, expected=expected, rng=rng_to_wire(data.rng))
        elif what == "verify":
            trials, index = frame.get_int("trials"), frame.get_int("index")
            lent = self._lent_trial
            unchanged = True
            if lent is not None and lent[:2] == (trials, index):
                unchanged = all(same_bytes(a, b) for a, b in zip(lent[2], lent[3], strict=False))
            self.send("answer", unchanged=unchanged)
        elif what == "timing_inputs":
            inputs = serve_with_room(ctx, "the timing inputs", ctx.timing_inputs)
            # Into the trials' input buffers: KernelBench's loop is done with them, and a second set
            # beside them would count against the device (kb_memory.Footprint.lent).
            wire = self.exchange.lend("inputs", inputs)
            # KernelBench's loop starts in the process as soon as this answer arrives: nothing else may be
            # starting on the device from here to the job's result.
            self.before_timing()
            self.timed_once = True
            self.send("answer", inputs=wire)
        else:
            raise ForbiddenMessage(f"a request for {what!r}")

    def fresh_probe(self, verdict: Verdict) -> None:
        """Faithful mode, after KernelBench's loop: calls on fresh inputs on the worker's clock, every
        output checked (module doc). A figure that looks forged is measured again (up to PROBE_ROUNDS
        rounds; PROBE_ROUNDS_CPU, after pauses, on the CPU; the fastest call of all counting): a moment
        of a busy machine must not be a warning."""
        self.before_timing()
        session = kb_strict.StrictSession(self.ctx, every=True, tolerance=(self.atol, self.rtol))
        self.timing = self.timed_once = True
        reported = float(verdict.runtime_stats["mean"])
        kind = self.ctx.device.type
        cores: list[float] = []
        reads: list[float] = []
        nulls: list[float] = []
        try:
            first = self._fresh(session, 0)
            in_views, out_views = self._bind(first, self._like(first))
            copy_cap = 1e3 * nbytes(out_views) / COPY_BACK_FLOOR_BPS[kind]
            rounds = PROBE_ROUNDS_CPU if kind == "cpu" else PROBE_ROUNDS
            for round_ in range(rounds):
                if round_ and kind == "cpu":
                    time.sleep(ROUND_PAUSE_S)
                for n in range(round_ * PROBE_CALLS, (round_ + 1) * PROBE_CALLS):
                    inputs = first if n == 0 else self._fresh(session, n)
                    if kind == "cuda" and self.job["timing"]["l2_flush"]:
                        self.flusher.flush(self.ctx.device)
                    call = self._call(n, inputs, in_views, out_views)
                    problem = self._fresh_problem(session, inputs, call.got, call.reply)
                    if problem is not None:
                        warn(verdict, "fresh_output_mismatch", problem)
                        return
                    cores.append(call.span - call.copies)
                    reads.append(call.read)
                nulls.extend(self._null_call(first, in_views, out_views) for _ in range(NULL_CALLS))
                hand_over = min(statistics.median(nulls), NULL_CAP_MS)
                copy_back = min(min(reads), copy_cap)
                bound = memo_bound(min(cores), hand_over, copy_back, kind)
                if reported >= bound:
                    break
        finally:
            self.timing = False
            session.close()
        fastest = min(cores)
        verdict.metadata["worker_clock"] = {
            "fresh_call_ms": fastest,
            "hand_over_ms": hand_over,
            "copy_back_ms": copy_back,
            "reported_mean_ms": reported,
        }
        if reported < bound:
            warn(
                verdict,
                "memo_suspected",
                f"KernelBench's loop reported {reported:.3f} ms per call, but calls on inputs no call had seen took "
                f"at least {fastest:.3f} ms on the worker's clock (of which at most {hand_over:.3f} ms is handing "
                f"over and {copy_back:.3f} ms copying the output back): the timed calls may hit a memo, skip work, "
                "or report a time they did not take",
            )

    def _fresh_problem(self, session: kb_strict.StrictSession, inputs: list[Any], got: Any, reply: Frame) -> str | None:
        """What is wrong with a fresh call's output (faithful mode's probe), or None."""
        if reply.raw("verdict") is not None or reply.raw("mismatch") is not None:
            return "after timing, a call on inputs no call had seen failed"
        problem = self._check(session, inputs, got, PROBE_CALLS)
        if problem is None:
            return None
        return (
            f"after timing, on inputs no call had seen, {problem}: the timed calls may have returned a stolen, "
            "memoised or unfinished output"
        )

    def _null_call(self, inputs: list[Any], in_views: Any, out_views: Any) -> float:
        """A call through the whole hand-over (the worker's copies, the messages, a device step in the
        process and its synchronisation) with no forward: its span less the worker's own copies."""
        span, _, _, copies, _ = self._call(NULL_CALL, inputs, in_views, out_views)
        return span - copies

    def escape_probe(self, verdict: Verdict) -> None:
        """Faithful mode: work on another stream escapes KernelBench's events (kb_timing.stream_escape_probe)."""
        reply = self.exchange_frame("escape", "escape")
        event_ms, host_ms = reply.get_float("event_ms", optional=True), reply.get_float("host_ms", optional=True)
        if event_ms is None or host_ms is None:
            return
        if escaped(event_ms, host_ms):
            warn(
                verdict,
                "stream_escape",
                f"a call took {host_ms:.3f} ms to a device-wide synchronize but {event_ms:.3f} ms on the timed "
                "stream's events: work on another stream escapes the measurement, so the speedup is overstated",
            )


def escaped(event_ms: float, host_ms: float) -> bool:
    """True when a device-wide wait says clearly more work ran than the timed stream's events saw."""
    return host_ms - event_ms >= max(ESCAPE_MIN_MS, ESCAPE_SHARE * host_ms)


def _alias_of(output: Any, inputs: list[Any]) -> int | None:
    """The index of the input the reference's output is (exactly) a view of, as KernelBench hands it."""
    if not isinstance(output, torch.Tensor):
        return None
    for position, value in enumerate(inputs):
        if (
            isinstance(value, torch.Tensor)
            and value.data_ptr() == output.data_ptr()
            and value.shape == output.shape
            and value.stride() == output.stride()
            and value.dtype == output.dtype
        ):
            return position
    return None


def output_like(ctx: ProblemContext, inputs: list[Any]) -> Any:
    """The reference's output structure for inputs of this layout (meta tensors: shapes and dtypes),
    found by one reference forward per layout and kept on the context."""
    cache: dict[Any, Any] = ctx.__dict__.setdefault("output_layouts", {})
    key = tuple((tuple(t.shape), t.dtype) if isinstance(t, torch.Tensor) else repr(t) for t in inputs)
    if key not in cache:
        cache[key] = _meta(ctx.reference_output(inputs))
    return cache[key]


def _meta(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return torch.empty(value.shape, dtype=value.dtype, device="meta")
    if type(value) in (list, tuple):
        return type(value)(_meta(v) for v in value)
    return None


__all__ = ["Driver", "ForbiddenMessage", "ProcessGone", "to_wire"]
