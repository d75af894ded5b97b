"""Strict timing's inputs and checks (kb_strict) with the real loop (kb_timing.time_strict) and a real
reference context on the CPU: every timed call sees inputs no call has seen, a content memo never hits,
skipping work is caught by checks decided after the output exists, a re-verification checks every call,
and the check decision is independent of the call. Counts and verdicts only, never durations."""

from __future__ import annotations

import random
from collections.abc import Iterator
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
import kb_tensors
import kb_timing
from harness_client import FIXTURES, evaluate_request, prepare_request

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

TIMING = {"warmup": 2, "trials": 40, "discard_first": 1, "l2_flush": False}


@pytest.fixture()
def ctx() -> kb_reference.ProblemContext:
    kb_native.ensure()  # strict timing's native loop, loaded here as a worker loads it for the reference
    cache = kb_reference.ReferenceCache()
    context = cache.context(kb_reference.ReferenceSpec(PROBLEM, torch.device("cpu"), "fp32", "strict", 42))
    assert context.error is None
    return context


def honest(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x * 2 + y


def run(ctx: kb_reference.ProblemContext, fn: Any, session: kb_strict.StrictSession) -> list[float]:
    return kb_timing.time_strict(
        fn, session.warmup_inputs, session.inputs, ctx.device, TIMING, kb_timing.L2Flusher(), session.check
    )


def test_every_timed_call_sees_inputs_no_call_has_seen(ctx: kb_reference.ProblemContext) -> None:
    session = kb_strict.StrictSession(ctx)
    seen: set[bytes] = set()

    def record(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        seen.add(x.numpy().tobytes() + y.numpy().tobytes())
        return honest(x, y)

    times = run(ctx, record, session)
    calls = TIMING["trials"] + TIMING["discard_first"]
    assert len(times) == TIMING["trials"]
    # The warm-up set plus one set per timed call, all different.
    assert len(seen) == calls + 1
    assert session.calls == calls
    assert ctx.counts["strict_inputs"] == calls + 1


def test_a_content_memo_never_hits(ctx: kb_reference.ProblemContext) -> None:
    memo: dict[bytes, torch.Tensor] = {}
    hits = 0

    def memoise(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        nonlocal hits
        key = x.numpy().tobytes() + y.numpy().tobytes()
        if key in memo:
            hits += 1
            return memo[key]
        memo[key] = honest(x, y)
        return memo[key]

    run(ctx, memoise, kb_strict.StrictSession(ctx))
    # Today's loop cycled through three sets (`call % 3`): the memo hit on every call after the third.
    assert hits == TIMING["warmup"] - 1  # only the warm-ups repeat one set


def test_skipping_work_on_unchecked_calls_is_caught(ctx: kb_reference.ProblemContext) -> None:
    # Honest on the first four calls (what the old fixed schedule checked first), stale afterwards.
    calls = 0
    last: torch.Tensor | None = None

    def skipper(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        nonlocal calls, last
        calls += 1
        if calls <= TIMING["warmup"] + 4 or last is None:
            last = honest(x, y)
        return last

    session = kb_strict.StrictSession(ctx)
    session._decide = random.Random(7)  # a fixed draw for a reproducible test; a secret one in the worker
    with pytest.raises(kb_timing.TimedOutputMismatch) as caught:
        run(ctx, skipper, session)
    assert caught.value.call > 4
    assert "does not match" in caught.value.problem


def test_a_reverification_checks_every_call(ctx: kb_reference.ProblemContext) -> None:
    session = kb_strict.StrictSession(ctx, every=True)
    run(ctx, honest, session)
    assert session.checked == TIMING["trials"] + TIMING["discard_first"]
    # And the first stale output fails it.
    stale: list[torch.Tensor] = []

    def once(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if not stale:
            stale.append(honest(x, y))
        return stale[0]

    with pytest.raises(kb_timing.TimedOutputMismatch) as caught:
        run(ctx, once, kb_strict.StrictSession(ctx, every=True))
    assert caught.value.call == 1  # the warm-ups ran on another set: the first timed call is checked and fails


def test_checks_are_a_share_of_the_calls_decided_per_call(ctx: kb_reference.ProblemContext) -> None:
    session = kb_strict.StrictSession(ctx)
    session._decide = random.Random(3)
    run(ctx, honest, session)
    calls = TIMING["trials"] + TIMING["discard_first"]
    p = kb_strict.check_probability(calls, every=False)
    assert p == pytest.approx(max(kb_strict.CHECK_SHARE, kb_strict.MIN_CHECKS / calls))
    assert 0 < session.checked < calls
    assert kb_strict.check_probability(5, every=False) == 1.0
    assert kb_strict.check_probability(1000, every=False) == kb_strict.CHECK_SHARE


def test_inputs_follow_the_key_and_secret_keys_differ(ctx: kb_reference.ProblemContext) -> None:
    a = kb_tensors.clone_tensors(kb_strict.StrictSession(ctx, key=5).inputs(0, keep=False))
    b = kb_tensors.clone_tensors(kb_strict.StrictSession(ctx, key=5).inputs(0, keep=False))
    c = kb_tensors.clone_tensors(kb_strict.StrictSession(ctx).inputs(0, keep=False))
    d = kb_tensors.clone_tensors(kb_strict.StrictSession(ctx).inputs(0, keep=False))
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not torch.equal(c[0], d[0])


def test_a_write_into_handed_inputs_does_not_reach_the_check(ctx: kb_reference.ProblemContext) -> None:
    def overwrite(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = honest(x, y)
        x.zero_()  # the check runs the reference on the pristine inputs, not on these
        return out

    session = kb_strict.StrictSession(ctx, every=True)
    run(ctx, overwrite, session)
    assert session.checked == TIMING["trials"] + TIMING["discard_first"]


def test_only_plain_tensors_are_compared(ctx: kb_reference.ProblemContext) -> None:
    class Sub(torch.Tensor):
        pass

    session = kb_strict.StrictSession(ctx, every=True)
    args = session.inputs(0)
    out = honest(*args).as_subclass(Sub)
    problem = session.check(0, out, 1)
    assert problem is not None and "not a plain torch.Tensor" in problem
    assert session.check(1, honest(*args), 2) == "no inputs were handed out for this call"


def test_the_side_stream_probe_flags_only_a_large_escaped_share() -> None:
    # A side-stream kernel: the events see the launch, the device-wide synchronize waits for the work.
    assert kb_timing.escaped(event_ms=0.01, host_ms=2.0)
    # Honest: launch overhead on top of a short kernel, and a long kernel with its overhead.
    assert not kb_timing.escaped(event_ms=0.02, host_ms=0.09)
    assert not kb_timing.escaped(event_ms=3.0, host_ms=3.2)
    # Half escaped, but the gap is below what launch jitter can explain.
    assert not kb_timing.escaped(event_ms=0.1, host_ms=0.4)


def test_cpu_outputs_cross_to_the_worker_as_bytes_without_a_serving_thread() -> None:
    import threading

    before = {t.ident for t in threading.enumerate()}
    values = [torch.arange(6, dtype=torch.float32).reshape(2, 3), torch.tensor(3.5, dtype=torch.bfloat16),
              torch.zeros(0, 4, dtype=torch.int64), torch.tensor([True, False])]
    wired = kb_strict.to_wire((values[0], [values[1], values[2]], values[3]))
    back = kb_strict.from_wire(wired)
    assert type(back) is tuple and type(back[1]) is list
    flat = [back[0], back[1][0], back[1][1], back[2]]
    for got, want in zip(flat, values, strict=True):
        assert type(got) is torch.Tensor and got.dtype == want.dtype and got.shape == want.shape
        assert torch.equal(got, want)
    assert {t.ident for t in threading.enumerate()} == before


def test_inputs_are_handed_out_in_order_one_call_at_a_time(ctx: kb_reference.ProblemContext) -> None:
    session = kb_strict.StrictSession(ctx, every=True)
    args = session.inputs(0)
    # Asking ahead (to compute call 1's output before it is timed) breaks the sequence.
    with pytest.raises(kb_strict.StrictOrderError):
        session.inputs(1)
    assert session.check(0, honest(*args), 3) is None
    with pytest.raises(kb_strict.StrictOrderError):
        session.inputs(2)
    session.inputs(1)
    assert session.check(0, honest(*args), 3) == "no inputs were handed out for this call"


def test_a_strict_trial_hands_out_shapes_only_and_compares_in_the_session(ctx: kb_reference.ProblemContext) -> None:
    session = kb_strict.StrictSession(ctx)
    seeds = kb_reference.trial_seeds(ctx.seed, 2)
    data = session.trial(2, 0, seeds[0])
    assert data.output.device.type == "meta" and data.output.shape == (64,)
    assert session.compare_trial(0, honest(*data.inputs)).passed
    with pytest.raises(kb_strict.StrictOrderError):  # compared once
        session.compare_trial(0, honest(*data.inputs))
    data = session.trial(2, 1, seeds[1])
    wrong = session.compare_trial(1, torch.zeros(64))
    assert not wrong.passed and wrong.max_diff > 0 and wrong.detail is not None
    assert session.trials_passed == 1
    data = session.trial(2, 1, seeds[1])
    assert session.compare_trial(1, torch.zeros(3)).shapes == ("torch.Size([64])", "torch.Size([3])")


# ---------------------------------------------------------------- correctness trials in real processes

MATMUL = (FIXTURES / "integrity" / "problem_matmul.py").read_text()
HONEST = (FIXTURES / "integrity" / "honest.py").read_text()


@pytest.fixture(scope="module")
def worker() -> Iterator[kb_eval.Worker]:
    isolated = kb_eval.Worker(isolate=True)
    assert kb_prepare.prepare(prepare_request(1, MATMUL), isolated)["status"] == "ready"
    yield isolated
    isolated.close()


def evaluate(worker: kb_eval.Worker, root: Path, name: str, mode: str, measure: bool = True) -> dict[str, Any]:
    source = HONEST if name == "honest" else (FIXTURES / "strict" / name).read_text()
    request = evaluate_request(2, MATMUL, source, root / name, mode=mode, measure=measure, timing_trials=10)
    response = kb_eval.evaluate(request, worker)
    assert kb_protocol.check_response(response) == []
    return response


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["strict", "faithful"])
def test_trials_compare_where_the_expected_outputs_are(worker: kb_eval.Worker, tmp_path: Path, mode: str) -> None:
    """Strict: the candidate's process never holds a trial's expected output nor runs its comparison, so
    stealing it (gc_stealer) or patching every comparison there (compare_patcher, trial_patcher) fails
    the trials themselves. Faithful keeps KernelBench's in-process comparison: all three pass it (the
    fresh-input probe warns about them, tests/strict_hostile.rs)."""
    before = evaluate(worker, tmp_path, "honest", mode)
    verdicts = {name: evaluate(worker, tmp_path, name, mode) for name in ("gc_stealer.py", "compare_patcher.py", "trial_patcher.py")}
    after = evaluate(worker, tmp_path, "honest", mode)
    for response in (before, after):
        assert response["status"] == "correct" and response["correctness"] is True, response
    for name, response in verdicts.items():
        if mode == "faithful":
            assert response["status"] == "correct", (name, response)  # as KernelBench would judge it
            continue
        assert response["status"] != "correct" and response["speedup"] is None, (name, response)
    if mode == "strict":
        assert verdicts["compare_patcher.py"]["metadata"]["correctness_issue"] == "Output mismatch"
        assert verdicts["compare_patcher.py"]["metadata"]["correctness_trials"] == "(0 / 5)"
        # The patched proxy reports 5 / 5; the worker's timed checks fail it, and without timing the
        # worker's own count of trials passed does.
        patched = verdicts["trial_patcher.py"]
        assert patched["metadata"]["correctness_issue_name"] == "timed_output_mismatch", patched
        untimed = evaluate(worker, tmp_path, "trial_patcher.py", mode, measure=False)
        assert untimed["status"] == "incorrect", untimed
        assert untimed["metadata"]["correctness_issue_name"] == "forged_result", untimed
        # The stealer finds no expected output in its process: it computes, or returns what it found.
        assert verdicts["gc_stealer.py"]["status"] in ("incorrect", "runtime_error")


@pytest.mark.slow
def test_a_forged_result_is_refused_in_strict_mode(worker: kb_eval.Worker, tmp_path: Path) -> None:
    response = evaluate(worker, tmp_path, "forged_result.py", "strict")
    assert response["status"] == "incorrect" and response["speedup"] is None, response
    assert response["metadata"]["correctness_issue_name"] == "forged_result"
    assert [f["category"] for f in response["findings"]] == ["forged_result"]
    assert evaluate(worker, tmp_path, "honest", "strict")["status"] == "correct"
