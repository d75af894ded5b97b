"""Reference data trial by trial: `prepare` one step at a time, a candidate's check that builds only the
trials it reaches, timing inputs only after correctness passed, unchanged verdicts, and the `progress`
notices that take reference work off a candidate's clock. Counters, never wall-clock times."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Any

import pytest

import kb_drive
import kb_eval
import kb_prepare
import kb_protocol
from harness_client import HOSTILE, WorkerProcess, evaluate_request, prepare_request

ADD = (HOSTILE / "problem_add.py").read_text()
# Counts the reference's forwards (on the class: a fresh count per loaded problem).
COUNTING = ADD.replace(
    "        return a + b",
    "        type(self).calls = getattr(type(self), 'calls', 0) + 1\n        return a + b",
)
DROPOUT = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, p):
        super().__init__()
        self.dropout = nn.Dropout(p)

    def forward(self, x):
        return self.dropout(x) * 2.0


def get_inputs():
    return [torch.rand(16, 16)]


def get_init_inputs():
    return [0.5]
"""


def candidate(body: str) -> str:
    return "import torch\nimport torch.nn as nn\n\n" + textwrap.dedent(body)


CORRECT = candidate(
    """
    class ModelNew(nn.Module):
        def forward(self, a, b):
            return torch.add(a, b)
    """
)
RAISES = candidate(
    """
    class ModelNew(nn.Module):
        def forward(self, a, b):
            raise RuntimeError("the kernel failed")
    """
)
# Passes trials 1 and 2, raises in trial 3.
RAISES_IN_TRIAL_3 = candidate(
    """
    class ModelNew(nn.Module):
        calls = 0

        def forward(self, a, b):
            type(self).calls += 1
            if type(self).calls == 3:
                raise RuntimeError("trial 3 failed")
            return a + b
    """
)
SHAPE = (HOSTILE / "shape_mismatch.py").read_text()
VALUE = (HOSTILE / "value_mismatch.py").read_text()
DROPOUT_CANDIDATE = candidate(
    """
    class ModelNew(nn.Module):
        def __init__(self, p):
            super().__init__()
            self.dropout = nn.Dropout(p)

        def forward(self, x):
            return self.dropout(x) * 2.0
    """
)


class Harness:
    """An in-process worker (candidates run here: the checking logic, not the isolation, is tested)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.worker = kb_eval.Worker(isolate=False)
        self.count = 0

    def evaluate(self, source: str, problem: str = COUNTING, **options: Any) -> dict[str, Any]:
        self.count += 1
        request = evaluate_request(self.count, problem, source, self.root / f"c{self.count}", **options)
        response = kb_eval.evaluate(request, self.worker)
        assert kb_protocol.check_response(response) == []
        return response

    def prepare(self, problem: str = COUNTING, **options: Any) -> dict[str, Any]:
        self.count += 1
        response = kb_prepare.prepare(prepare_request(self.count, problem, **options), self.worker)
        assert kb_protocol.check_response(response) == []
        return response

    def context(self) -> kb_eval.ProblemContext:
        (ctx,) = self.worker.references.contexts.values()
        return ctx


@pytest.fixture()
def harness(tmp_path: Path) -> Harness:
    return Harness(tmp_path)


def _calls(ctx: kb_eval.ProblemContext) -> int:
    assert ctx.problem is not None
    return int(getattr(ctx.problem.model, "calls", 0))


def test_prepare_builds_one_step_per_request_in_a_candidates_order(harness: Harness) -> None:
    for k in range(1, 6):
        r = harness.prepare(steps=1)
        assert (r["status"], r["built"], r["trials_ready"], r["done"]) == ("ready", [f"trial {k}"], k, False)
        assert r["next"] == ("trial" if k < 5 else "timing_inputs")
    ctx = harness.context()
    assert (ctx.counts["trials"], ctx.counts["inputs"], _calls(ctx)) == (5, 5, 5)
    r = harness.prepare(steps=1)
    assert (r["built"], r["next"], r["done"]) == (["timing inputs"], "reference_timing", False)
    assert ctx.counts["timing_inputs"] == 1 and ctx.counts["inputs"] == 6
    # Not quiet yet (the CPU device's builds still run): the reference is not timed.
    r = harness.prepare(steps=1, quiet=False)
    assert (r["built"], r["next"], r["done"]) == ([], "reference_timing", False)
    assert _calls(ctx) == 5
    r = harness.prepare(steps=1)
    assert (r["built"], r["next"], r["done"]) == (["reference timing"], None, True)
    assert _calls(ctx) == 5 + 104  # 3 warm-ups, 1 discarded, 100 timed
    again = harness.prepare(steps=1)
    assert (again["built"], again["done"], again["trials_ready"]) == ([], True, 5)
    assert (ctx.counts["inputs"], _calls(ctx)) == (6, 5 + 104)
    r = harness.evaluate(CORRECT)
    assert r["status"] == "correct" and r["ref_runtime_source"] == "cached"
    # The candidate found everything built; the only forwards are the worker's after KernelBench's loop
    # (faithful mode's fresh calls: one for the output's shape, one per checked call; their inputs are
    # counted as "strict_inputs") and the precision probe's (float32 and float64), once per problem.
    assert (ctx.counts["inputs"], _calls(ctx)) == (6, 5 + 104 + 1 + kb_drive.PROBE_CALLS + 2)


def test_prepare_without_steps_builds_everything_at_once(harness: Harness) -> None:
    r = harness.prepare()
    assert r["built"] == [f"trial {k}" for k in range(1, 6)] + ["timing inputs", "reference timing"]
    assert (r["done"], r["next"], r["trials_ready"]) == (True, None, 5)


def test_a_candidate_failing_trial_1_builds_one_reference_trial_not_five(harness: Harness) -> None:
    r = harness.evaluate(RAISES)
    assert r["status"] == "runtime_error" and r["metadata"]["runtime_error"] == "the kernel failed"
    ctx = harness.context()
    assert (ctx.counts["trials"], ctx.counts["inputs"], ctx.counts["timing_inputs"]) == (1, 1, 0)
    assert _calls(ctx) == 1
    assert [e is not None for e in ctx.trials[5]] == [True, False, False, False, False]
    # A shape mismatch stops at its first trial as well (KernelBench returns there).
    r = harness.evaluate(SHAPE)
    assert r["status"] == "incorrect" and "correctness_trials" not in r["metadata"]
    assert (ctx.counts["trials"], ctx.counts["inputs"]) == (1, 1)


def test_a_candidate_failing_trial_3_builds_three(harness: Harness) -> None:
    r = harness.evaluate(RAISES_IN_TRIAL_3)
    assert r["status"] == "runtime_error" and r["metadata"]["runtime_error"] == "trial 3 failed"
    ctx = harness.context()
    assert (ctx.counts["trials"], ctx.counts["inputs"], _calls(ctx)) == (3, 3, 3)
    # Background preparation picks up where the check stopped.
    r = harness.prepare(steps=1)
    assert (r["built"], r["trials_ready"]) == (["trial 4"], 4)


def test_a_value_mismatch_checks_every_trial_as_kernelbench_does(harness: Harness) -> None:
    # KernelBench does not stop at a value mismatch: all trials run and "(0 / 5)" is recorded.
    r = harness.evaluate(VALUE)
    assert r["status"] == "incorrect" and r["metadata"]["correctness_trials"] == "(0 / 5)"
    assert r["metadata"]["max_difference"] == ["1.000000"] * 5
    ctx = harness.context()
    assert (ctx.counts["trials"], ctx.counts["inputs"], ctx.counts["timing_inputs"]) == (5, 5, 0)


def test_timing_inputs_are_made_only_once_correctness_passed(harness: Harness) -> None:
    r = harness.evaluate(CORRECT, timing_trials=5)
    assert r["status"] == "correct" and r["ref_runtime_source"] == "measured"
    ctx = harness.context()
    assert (ctx.counts["trials"], ctx.counts["timing_inputs"], ctx.counts["inputs"]) == (5, 1, 6)
    # The reference work of the first candidate is booked as reference time.
    assert r["phases"]["reference_s"] > 0


def test_a_broken_reference_stops_preparation_at_the_trial_that_failed(harness: Harness) -> None:
    broken = COUNTING.replace(
        "        return a + b", "        if type(self).calls == 2:\n            raise ValueError('broken')\n        return a + b"
    )
    assert harness.prepare(problem=broken, steps=1)["built"] == ["trial 1"]
    r = harness.prepare(problem=broken, steps=1)
    assert (r["status"], r["built"], r["done"], r["next"]) == ("reference_error", ["trial 2"], True, None)
    assert "broken" in r["feedback"]
    assert harness.evaluate(CORRECT, problem=broken)["status"] == "reference_error"


def _verdict(r: dict[str, Any], root: Path) -> tuple[Any, ...]:
    """What a result says about the candidate; its build folder (in tracebacks) written as <build>."""
    build = re.compile(re.escape(str(root)) + r"/c\d+")
    metadata = {k: build.sub("<build>", v) if isinstance(v, str) else v for k, v in r["metadata"].items()}
    return (r["status"], r["compiled"], r["correctness"], metadata, r["runtime"] == -1.0)


@pytest.mark.parametrize(
    ("source", "problem"),
    [
        (CORRECT, COUNTING),
        (RAISES, COUNTING),
        (RAISES_IN_TRIAL_3, COUNTING),
        (SHAPE, COUNTING),
        (VALUE, COUNTING),
        (DROPOUT_CANDIDATE, DROPOUT),
    ],
    ids=["correct", "raises", "raises_in_trial_3", "shape", "value", "dropout_rng"],
)
def test_verdicts_are_the_same_prepared_partly_prepared_or_not(tmp_path: Path, source: str, problem: str) -> None:
    """The same candidate judged by fresh workers: nothing prepared (its check builds what it
    reaches), two steps prepared, everything prepared (KernelBench's metadata, to the string)."""
    results = []
    for name, steps in [("lazy", 0), ("partly", 2), ("full", None)]:
        harness = Harness(tmp_path / name)
        if steps != 0:
            harness.prepare(problem=problem, steps=steps, measure=False)
        result = harness.evaluate(source, problem=problem, measure=False)
        results.append(_verdict(result, harness.root))
    assert results[0] == results[1] == results[2]


def test_evaluate_announces_reference_work_with_progress_notices(cpu_worker: WorkerProcess, work: Path) -> None:
    """Through the real serve loop: reference work during an evaluate comes as start/end notices with
    the evaluate's id (harness_client checks that they alternate); a second candidate, with
    everything cached, gets none."""
    problem = ADD.replace("N = 64", "N = 48")  # a problem no other test of the session warmed
    seen = len(cpu_worker.progress)
    first = cpu_worker.request(evaluate_request(901, problem, CORRECT, work / "build" / "progress1", trials=5))
    assert first["status"] == "correct" and first["ref_runtime_source"] == "measured"
    notices = cpu_worker.progress[seen:]
    assert notices and all(n["id"] == 901 for n in notices)
    assert [n["reference"] for n in notices[:2]] == ["start", "end"]
    seen = len(cpu_worker.progress)
    second = cpu_worker.request(evaluate_request(902, problem, CORRECT, work / "build" / "progress2", trials=5))
    assert second["status"] == "correct" and second["ref_runtime_source"] == "cached"
    assert cpu_worker.progress[seen:] == []


def test_a_long_reference_timing_is_left_to_the_first_correct_candidate(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A background step cannot be interrupted: timing a reference whose forwards say it would hold the
    device too long is not one of them; the first correct candidate's evaluation times it."""
    monkeypatch.setattr(kb_prepare, "BACKGROUND_TIMING_MAX_S", 0.0)
    for _ in range(6):
        harness.prepare(steps=1)
    ctx = harness.context()
    assert ctx.timing_inputs_cache is not None and len(ctx.forward_seconds) == 5
    r = harness.prepare(steps=1)
    assert (r["built"], r["done"], r["next"]) == ([], True, None)
    assert _calls(ctx) == 5
    # A preparation asked for everything at once still times it.
    full = Harness(harness.root / "full")
    assert full.prepare()["built"][-1] == "reference timing"
    r = harness.evaluate(CORRECT, timing_trials=5)
    assert r["status"] == "correct" and r["ref_runtime_source"] == "measured"


def test_the_kernelbench_order_yardstick_agrees_with_the_harness(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """bench/reference/kernelbench_order.py (KernelBench's order, for `krefine bench reference`; run
    here in-process) reaches the same verdicts, and stops where KernelBench stops."""
    import importlib.util
    import json

    from harness_client import HARNESS_DIR, REPO

    spec = importlib.util.spec_from_file_location("kernelbench_order", REPO / "bench" / "reference" / "kernelbench_order.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    problem = tmp_path / "problem.py"
    problem.write_text(ADD)
    seen = {}
    for name, source in [("correct", CORRECT), ("value", VALUE), ("raises", RAISES)]:
        path = tmp_path / f"{name}.py"
        path.write_text(source)
        args = [str(HARNESS_DIR), str(problem), str(path), str(tmp_path / f"build_{name}"), "cpu", "5", "3", "1"]
        assert script.main(args) == 0
        seen[name] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (seen["correct"]["status"], seen["correct"]["passed"]) == ("correct", 5)
    assert "timing_s" in seen["correct"]["phases"] and "ref_timing_s" in seen["correct"]["phases"]
    assert (seen["value"]["status"], seen["value"]["trials_run"]) == ("incorrect", 5)
    # A raising trial ends the check; KernelBench times the reference all the same.
    assert (seen["raises"]["status"], seen["raises"]["trials_run"]) == ("runtime_error", 1)
    assert "ref_timing_s" in seen["raises"]["phases"] and "timing_s" not in seen["raises"]["phases"]


# ------------------------------------------------------------------------------ GPU memory admission


def test_memory_admission_evicts_least_recently_used_until_the_work_fits() -> None:
    from kb_reference import evictions, need_bytes

    cached = [("a", 40), ("b", 0), ("c", 30), ("d", 20)]
    assert evictions(100, 100, cached) == ([], True)
    assert evictions(50, 80, cached) == (["a"], True)
    assert evictions(50, 120, cached) == (["a", "c"], True)
    assert evictions(50, 140, cached) == (["a", "c", "d"], True)
    # Not enough even with everything freed: all of it goes, and the work is told it does not fit.
    assert evictions(50, 141, cached) == (["a", "c", "d"], False)
    assert evictions(0, 1, []) == ([], False)
    # Three times the inputs, and 5 % of an 80 GB device.
    assert need_bytes(2 * 10**9, 80 * 10**9) == 10 * 10**9


def _other(i: int) -> str:
    """A problem of its own (another code, so another cache entry)."""
    return ADD.replace("return a + b", f"return a + b + {i} * 0")


def test_admission_bookkeeping_gives_way_to_the_problem_at_hand(harness: Harness) -> None:
    cache = harness.worker.references
    for i in range(3):
        harness.prepare(problem=_other(i))
    keys = list(cache.contexts)
    for key, held in zip(keys, (300, 200, 100), strict=True):
        cache.contexts[key].device_bytes = held
    current = cache.contexts[keys[2]]
    # 150 free, 500 needed: the oldest two go (300 + 200 > 350), the problem at hand stays.
    assert cache.admit(current, 150, 500) == keys[:2]
    assert list(cache.contexts) == keys[2:] and cache.evicted_for_room == 2
    assert current.device_cache
    # Nothing left to free and still short: its own data stays off the device.
    assert cache.admit(current, 150, 500) == []
    assert not current.device_cache


def _oom_once(flag: Path) -> str:
    """The ADD problem, whose reference runs out of memory once (while `flag` exists)."""
    return ADD.replace(
        "        return a + b",
        f"        import os\n        if os.path.exists({str(flag)!r}):\n            os.remove({str(flag)!r})\n"
        "            raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 2.00 GiB')\n"
        "        return a + b",
    )


def test_a_reference_out_of_memory_next_to_cached_problems_is_retried_after_freeing_them(
    harness: Harness, tmp_path: Path
) -> None:
    cache = harness.worker.references
    harness.prepare(problem=_other(1))
    (other,) = cache.contexts.values()
    other.device_bytes = 4096
    flag = tmp_path / "oom"
    flag.touch()
    r = harness.evaluate(CORRECT, problem=_oom_once(flag))
    # krefine's caches were freed and the reference prepared again: the candidate got its own verdict.
    assert r["status"] == "correct", r
    assert r["metadata"]["reference_retried_after_eviction"] == 4096
    assert other not in cache.contexts.values() and cache.evicted_for_room == 1
    # With nothing of krefine's cached, the reference is evaluated once more all the same, its data kept
    # off the device: krefine's buffers and its allocator's fragments may be what was short (issue 39:
    # level 1's problem 45, 16 GiB of inputs, ran out on an 80 GB card beside no cache at all, and was
    # called too large for the device).
    flag.touch()
    lone = Harness(tmp_path / "lone")
    r = lone.evaluate(CORRECT, problem=_oom_once(flag))
    assert r["status"] == "correct", r
    assert r["metadata"]["reference_retried_after_eviction"] == 0
    assert len(lone.worker.references.off_device) == 1


def test_a_reference_that_always_runs_out_of_memory_is_retried_once_and_stays_the_references(
    tmp_path: Path,
) -> None:
    calls = tmp_path / "calls"
    always = ADD.replace(
        "        return a + b",
        f"        with open({str(calls)!r}, 'a') as f:\n            f.write('x')\n"
        "        raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 2.00 GiB')",
    )
    r = Harness(tmp_path / "h").evaluate(CORRECT, problem=always)
    assert r["status"] == "reference_error" and r["metadata"]["reference_out_of_memory"] is True
    assert r["metadata"]["reference_retried_after_eviction"] == 0
    assert calls.read_text() == "xx"  # the first attempt's first trial, and the retry's: no more


def test_prepare_retries_a_reference_out_of_memory_after_freeing_other_problems(
    harness: Harness, tmp_path: Path
) -> None:
    cache = harness.worker.references
    harness.prepare(problem=_other(2))
    (other,) = cache.contexts.values()
    other.device_bytes = 1
    flag = tmp_path / "oom"
    flag.touch()
    r = harness.prepare(problem=_oom_once(flag))
    assert (r["status"], r["done"]) == ("ready", True), r
    assert "out_of_memory" not in r
    assert other not in cache.contexts.values()
