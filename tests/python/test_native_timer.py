"""Strict mode's native timing loop (kb_native, kb_native_timer.cpp), built for real with the machine's
C++ compiler (once per session, conftest): a candidate that hunts the loop's state through frames and the
garbage collector finds none of it (the same hunter finds KernelBench's Python loop at once), hooks that
would run code outside forward stop the loop, strict mode never times without the native loop, and a
worker that cannot build it refuses strict evaluations and says why. Verdicts, counts and exact values
only, never durations."""

from __future__ import annotations

import gc
import os
import runpy
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import kb_eval
import kb_native
import kb_prepare
import kb_protocol
import kb_reference
import kb_strict
import kb_timing
from harness_client import FIXTURES, WorkerProcess, evaluate_request, prepare_request

PROBLEM = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x, y):
        return x * 2 + y


def get_inputs():
    return [torch.rand(64), torch.rand(64)]


def get_init_inputs():
    return []
"""

TIMING = {"warmup": 2, "trials": 12, "discard_first": 1, "l2_flush": False}
HUNTER = FIXTURES / "strict" / "loop_state_hunter.py"
MATMUL = (FIXTURES / "integrity" / "problem_matmul.py").read_text()
# In these in-process tests the test plays the worker, so strict mode's secret holders are here.
WORKER_SIDE = ("a FreshInputs", "a StrictSession")


@pytest.fixture()
def ctx() -> kb_reference.ProblemContext:
    kb_native.ensure()
    cache = kb_reference.ReferenceCache()
    context = cache.context(kb_reference.ReferenceSpec(PROBLEM, torch.device("cpu"), "fp32", "strict", 42))
    assert context.error is None
    return context


def honest(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x * 2 + y


def hunter() -> tuple[Callable[..., Any], list[str]]:
    """An honest forward that first runs the fixture's hunt, and what the hunt found (all calls)."""
    hunt = runpy.run_path(str(HUNTER))["_hunt"]
    found: list[str] = []

    def forward(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        found.extend(f for f in hunt() if f not in WORKER_SIDE)
        return honest(x, y)

    return forward, found


def run(ctx: kb_reference.ProblemContext, fn: Any, session: kb_strict.StrictSession) -> list[float]:
    return kb_timing.time_strict(
        fn, session.warmup_inputs, session.inputs, ctx.device, TIMING, kb_timing.L2Flusher(), session.check
    )


def test_forward_finds_none_of_the_loop_state(ctx: kb_reference.ProblemContext) -> None:
    forward, found = hunter()
    session = kb_strict.StrictSession(ctx)
    times = run(ctx, forward, session)
    assert found == []
    assert len(times) == TIMING["trials"] and all(t > 0.0 for t in times)
    assert session.calls == TIMING["trials"] + TIMING["discard_first"]


def test_the_hunter_finds_a_python_loop_at_once() -> None:
    """The control: KernelBench's loop (faithful mode's, in Python) is found on its first timed call."""
    forward, found = hunter()
    args = [torch.rand(64), torch.rand(64)]
    kb_timing.time_cpu(forward, args, warmup=0, trials=3, discard_first=0)
    assert "frame time_cpu: index" in found and "frame time_cpu: times" in found
    assert "a list of floats that grows by one per call" in found


def test_a_rewrite_of_what_forward_can_reach_leaves_the_times_alone(ctx: kb_reference.ProblemContext) -> None:
    """A forward that overwrites every list of floats in the process and every float local of every
    frame above it with -1.0 changes nothing the loop returns."""
    planted = -1.0

    def rewriter(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        for obj in gc.get_objects():
            if type(obj) is list and obj and all(type(v) is float for v in obj):
                obj[:] = [planted] * len(obj)
        frame = sys._getframe(1)
        while frame is not None:
            for name, value in frame.f_locals.items():
                if type(value) is float:
                    frame.f_locals[name] = planted
            frame = frame.f_back  # type: ignore[assignment]
        return honest(x, y)

    times = run(ctx, rewriter, kb_strict.StrictSession(ctx))
    assert len(times) == TIMING["trials"] and planted not in times


@pytest.mark.parametrize("hook", ["settrace", "setprofile", "gc_callback"])
def test_a_hook_installed_by_forward_stops_the_loop(ctx: kb_reference.ProblemContext, hook: str) -> None:
    def noop(*_: Any) -> None:
        return None

    calls = 0

    def install(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        nonlocal calls
        calls += 1
        if calls <= TIMING["warmup"]:  # one installed in a warm-up stops the loop before its first call
            return honest(x, y)
        if hook == "settrace":
            sys.settrace(noop)
        elif hook == "setprofile":
            sys.setprofile(noop)
        elif noop not in gc.callbacks:
            gc.callbacks.append(noop)
        return honest(x, y)

    try:
        with pytest.raises(kb_timing.TimingHooked) as caught:
            run(ctx, install, kb_strict.StrictSession(ctx))
    finally:
        sys.settrace(None)
        sys.setprofile(None)
        if noop in gc.callbacks:
            gc.callbacks.remove(noop)
    assert caught.value.call == 1
    assert "during timed call 1" in caught.value.message


def test_a_hook_installed_before_timing_stops_it_before_the_first_call(ctx: kb_reference.ProblemContext) -> None:
    calls = 0

    def count(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        nonlocal calls
        calls += 1
        return honest(x, y)

    gc.callbacks.append(_gc_noop)
    try:
        with pytest.raises(kb_timing.TimingHooked) as caught:
            run(ctx, count, kb_strict.StrictSession(ctx))
    finally:
        gc.callbacks.remove(_gc_noop)
    assert caught.value.call == 0 and "before timing" in caught.value.message
    assert calls == TIMING["warmup"]  # the untimed warm-ups only


def _gc_noop(*_: Any) -> None:
    return None


def test_strict_timing_never_falls_back_to_python(
    ctx: kb_reference.ProblemContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kb_native, "_module", None)
    with pytest.raises(kb_native.NativeTimerUnavailable, match="not loaded"):
        run(ctx, honest, kb_strict.StrictSession(ctx))


def test_a_failed_build_says_what_the_compiler_said(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CXX", "false")
    with pytest.raises(kb_native.NativeTimerUnavailable, match=r"false failed \(exit 1\)"):
        kb_native.build(tmp_path)
    assert not list(tmp_path.rglob("*.so"))


def test_a_worker_that_may_not_write_the_shared_folder_builds_privately(tmp_path: Path) -> None:
    """A sandboxed worker sees the shared folder read-only (here: a folder under /proc, which nobody may
    create): it builds in a private folder under its working folder, loads it, and leaves nothing."""
    script = "import kb_native; kb_native.ensure(); print(kb_native.loaded())"
    env = dict(os.environ, KREFINE_NATIVE_DIR="/proc/krefine-native-timer", PYTHONPATH=str(kb_native.HARNESS_DIR))
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"
    assert "loaded from a private build in " + str(tmp_path) in done.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_strict_prepare_builds_the_loop_before_any_evaluate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KREFINE_NATIVE_DIR", str(tmp_path / "native"))
    worker = WorkerProcess("compile", tmp_path / "scratch", tmp_path / "worker.log")
    try:
        request = dict(prepare_request(1, MATMUL), mode="strict")
        assert worker.request(request)["status"] == "ready"
        assert len(list((tmp_path / "native").rglob("kb_native_timer.so"))) == 1
    finally:
        assert worker.close() == 0
    assert "strict timing's native loop loaded from" in (tmp_path / "worker.log").read_text()


@pytest.mark.slow
def test_a_worker_without_a_compiler_refuses_strict_and_keeps_faithful(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv("KREFINE_NATIVE_DIR", str(tmp_path / "native"))
    worker = WorkerProcess("compile", tmp_path / "scratch", tmp_path / "worker.log")
    try:
        honest_source = (FIXTURES / "integrity" / "honest.py").read_text()
        strict = worker.request(
            evaluate_request(1, MATMUL, honest_source, tmp_path / "a", mode="strict", timing_trials=5)
        )
        assert strict["ok"] is False, strict
        assert "strict mode refuses to evaluate" in strict["error"] and "no-such-compiler" in strict["error"]
        faithful = worker.request(
            evaluate_request(2, MATMUL, honest_source, tmp_path / "b", mode="faithful", timing_trials=5)
        )
        assert faithful["ok"] is True and faithful["status"] == "correct", faithful
    finally:
        assert worker.close() == 0


@pytest.fixture(scope="module")
def worker() -> Iterator[kb_eval.Worker]:
    isolated = kb_eval.Worker(isolate=True)
    assert kb_prepare.prepare(prepare_request(1, MATMUL), isolated)["status"] == "ready"
    yield isolated
    isolated.close()


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["strict", "faithful"])
def test_the_hunter_in_its_own_process(worker: kb_eval.Worker, tmp_path: Path, mode: str) -> None:
    """Through the real candidate process: in strict mode the hunter finds nothing (not the loop's state,
    not the secrets, which stay in the worker), so it computes and is correct and timed; in faithful mode
    it finds KernelBench's Python loop at its first timed call (KernelBench keeps the verdict and drops
    the time)."""
    request = evaluate_request(2, MATMUL, HUNTER.read_text(), tmp_path / mode, mode=mode, timing_trials=10)
    response = kb_eval.evaluate(request, worker)
    assert kb_protocol.check_response(response) == []
    assert response["status"] == "correct", response
    if mode == "strict":
        assert response["runtime"] > 0 and response["speedup"] is not None, response
        assert response["findings"] == [], response
        assert "error_during_performance" not in response["metadata"], response
    else:
        assert "loop state found: " in response["metadata"]["error_during_performance"], response
        assert response["runtime"] == -1, response


@pytest.mark.slow
def test_times_from_a_replaced_timer_are_refused(worker: kb_eval.Worker, tmp_path: Path) -> None:
    """The timer replacer swaps the harness's Python entry to the loop for one that serves no calls: the
    worker, which counts the timed calls it served, refuses the result; the honest control still passes."""
    source = (FIXTURES / "strict" / "timer_replacer.py").read_text()
    request = evaluate_request(2, MATMUL, source, tmp_path / "replacer", mode="strict", timing_trials=10)
    response = kb_eval.evaluate(request, worker)
    assert response["status"] == "incorrect" and response["speedup"] is None, response
    assert response["metadata"]["correctness_issue_name"] == "forged_result", response
    assert "handed out inputs for 0" in response["metadata"]["correctness_issue"], response
    honest_source = (FIXTURES / "integrity" / "honest.py").read_text()
    control = evaluate_request(3, MATMUL, honest_source, tmp_path / "honest", mode="strict", timing_trials=10)
    assert kb_eval.evaluate(control, worker)["status"] == "correct"
