"""Correctness checking in-process on CPU with pure-Python candidates (no C++ builds needed):
KernelBench metadata strings, result classes, the reference cache, RNG fidelity, strict mode."""

from __future__ import annotations

import math
import platform
import re
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

import kb_correctness
import kb_drive
import kb_eval
import kb_inputs
import kb_prepare
import kb_protocol
import kb_reference
import kb_tensors
from harness_client import HOSTILE, evaluate_request, prepare_request

ADD = (HOSTILE / "problem_add.py").read_text()
HARDWARE = kb_eval.hardware_name(torch.device("cpu"))


def candidate(body: str) -> str:
    return "import torch\nimport torch.nn as nn\n\n" + textwrap.dedent(body)


CORRECT = candidate(
    """
    class ModelNew(nn.Module):
        def forward(self, a, b):
            return torch.add(a, b)
    """
)


class Harness:
    """One in-process worker plus a fresh build dir per call. The checking logic is tested with the
    candidate run in this process (fast); test_isolation.py runs candidates in their own processes."""

    def __init__(self, root: Path, isolate: bool = False) -> None:
        self.root = root
        self.worker = kb_eval.Worker(isolate=isolate)
        self.count = 0

    def evaluate(self, source: str, problem: str = ADD, **options: Any) -> dict[str, Any]:
        self.count += 1
        request = evaluate_request(self.count, problem, source, self.root / f"c{self.count}", **options)
        response = kb_eval.evaluate(request, self.worker)
        assert kb_protocol.check_response(response) == []
        return response


@pytest.fixture()
def harness(tmp_path: Path) -> Harness:
    return Harness(tmp_path)


def test_trial_seeds_golden_vector() -> None:
    assert kb_eval.trial_seeds(42, 5) == [734796314, 576165995, 2197670066, 839703249, 2584932063]


def test_correct_candidate(harness: Harness) -> None:
    r = harness.evaluate(CORRECT)
    assert (r["status"], r["compiled"], r["correctness"], r["sticky"]) == ("correct", True, True, False)
    # KernelBench's metadata, and what the worker measured on its side: its clock on fresh calls (the
    # faithful probe after KernelBench's loop) and the precision probe.
    assert {k: r["metadata"][k] for k in ("hardware", "device", "correctness_trials")} == {
        "hardware": HARDWARE,
        "device": "cpu",
        "correctness_trials": "(5 / 5)",
    }
    assert set(r["metadata"]) - {"hardware", "device", "correctness_trials"} == {"worker_clock", "precision"}
    assert r["metadata"]["precision"]["checked"] is True and r["metadata"]["precision"]["ratio"] < 16
    assert r["runtime"] == r["runtime_stats"]["mean"] > 0
    assert r["runtime_stats"]["num_trials"] == 100
    assert r["ref_runtime_source"] == "measured"
    assert math.isclose(r["speedup"], r["ref_runtime"] / r["runtime"])
    # Every candidate runs in a single-use process of its own, confined as far as this machine allows.
    env = dict(r["env"])
    assert env.pop("isolation") == "process"
    sandbox = env.pop("sandbox")
    assert isinstance(sandbox["layers"], list)
    assert env == {
        "device_name": HARDWARE,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "precision": "fp32",
        "mode": "faithful",
        "timing_method": "cpu_perf_counter",
        "tolerance": {"name": "kernelbench", "atol": 1e-4, "rtol": 1e-4},
        "reference_mode": "eager",
        "grad_mode": "no_grad",
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "tf32_cudnn": torch.backends.cudnn.allow_tf32,
        # What krefine set in the candidate's process (the reference's settings).
        "settings": {
            "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
            "tf32_cudnn": torch.backends.cudnn.allow_tf32,
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "cudnn_benchmark": torch.backends.cudnn.benchmark,
            "cudnn_deterministic": torch.backends.cudnn.deterministic,
            "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
            "num_threads": torch.get_num_threads(),
            "default_dtype": "torch.float32",
        },
        "integer_inputs": "kept",
        "inputs": "kernelbench",
        "transformers": kb_eval.package_version("transformers"),
        "python": platform.python_version(),
    }
    assert r["findings"] == [] and r["speedup_check"]["flagged"] is False
    assert "Correctness: 5 / 5 trials passed" in r["feedback"]
    assert "speedup" in r["feedback"]
    # The reference is timed once per worker; the next candidate reuses it.
    again = harness.evaluate(CORRECT)
    assert again["ref_runtime_source"] == "cached"
    assert again["ref_runtime_stats"] == r["ref_runtime_stats"]


def test_reference_runtime_from_the_request_is_used(harness: Harness, tmp_path: Path) -> None:
    request = evaluate_request(1, ADD, CORRECT, tmp_path / "b")
    request["reference_runtime"] = {
        "mean": 2.0,
        "median": 2.0,
        "std": 0.0,
        "min": 2.0,
        "max": 2.0,
        "num_trials": 100,
        "source": "baseline:H100_Modal/baseline_time_torch.json",
    }
    r = kb_eval.evaluate(request, harness.worker)
    assert r["ref_runtime"] == 2.0
    assert r["ref_runtime_source"] == "baseline:H100_Modal/baseline_time_torch.json"
    assert r["ref_runtime_stats"] == {
        "mean": 2.0,
        "median": 2.0,
        "std": 0.0,
        "min": 2.0,
        "max": 2.0,
        "num_trials": 100,
    }
    assert r["speedup"] == 2.0 / r["runtime"]


def test_no_timing_when_not_asked(harness: Harness) -> None:
    r = harness.evaluate(CORRECT, measure=False)
    assert r["status"] == "correct"
    assert (r["runtime"], r["runtime_stats"], r["ref_runtime"], r["ref_runtime_stats"]) == (
        -1.0,
        {},
        -1.0,
        {},
    )
    assert r["speedup"] is None and r["ref_runtime_source"] is None


def test_value_mismatch_metadata_is_kernelbench_exact(harness: Harness) -> None:
    r = harness.evaluate((HOSTILE / "value_mismatch.py").read_text())
    assert r["status"] == "incorrect" and r["compiled"] and not r["correctness"]
    assert r["metadata"] == {
        "hardware": HARDWARE,
        "device": "cpu",
        "max_difference": ["1.000000"] * 5,
        "avg_difference": ["0.000244"] * 5,
        "correctness_issue": "Output mismatch",
        "correctness_trials": "(0 / 5)",
    }
    assert r["runtime"] == -1.0
    lines = r["feedback"].splitlines()
    assert lines[0].startswith(
        "Trial 1 of 5: output mismatch: max abs diff 1, mean abs diff 0.000244141; 1 of 4096 elements "
        "(0.02%) outside tolerance; first mismatch at index (0, 3): expected "
    )
    assert lines[3] == "Trials 4, 5 also mismatch."
    assert lines[4] == "Correctness: 0 / 5 trials passed (fp32, torch.allclose with atol = rtol = 0.0001)."


def test_some_trials_pass(harness: Harness) -> None:
    source = candidate(
        """
        calls = [0]
        class ModelNew(nn.Module):
            def forward(self, a, b):
                calls[0] += 1
                return a + b + (1.0 if calls[0] % 2 == 0 else 0.0)
        """
    )
    r = harness.evaluate(source)
    assert r["metadata"]["correctness_trials"] == "(3 / 5)"
    assert r["metadata"]["max_difference"] == ["1.000000", "1.000000"]
    assert r["status"] == "incorrect"


def test_shape_mismatch_metadata(harness: Harness) -> None:
    r = harness.evaluate((HOSTILE / "shape_mismatch.py").read_text())
    assert r["status"] == "incorrect"
    assert r["metadata"] == {
        "hardware": HARDWARE,
        "device": "cpu",
        "correctness_issue": "Output shape mismatch: Expected torch.Size([64, 64]), got torch.Size([32, 64])",
        "correctness_issue_name": "correctness_issue",
    }
    assert r["feedback"] == (
        "Output shape mismatch in correctness trial 1 of 5: expected torch.Size([64, 64]), "
        "got torch.Size([32, 64])."
    )


def test_runtime_error_in_forward_is_truncated_like_kernelbench(harness: Harness) -> None:
    source = candidate(
        """
        class ModelNew(nn.Module):
            def forward(self, a, b):
                raise ValueError("v" * 300)
        """
    )
    r = harness.evaluate(source)
    assert (r["status"], r["compiled"], r["correctness"]) == ("runtime_error", True, False)
    md = r["metadata"]
    assert md["runtime_error"] == "v" * 197 + "..."
    assert md["runtime_error_name"] == "builtins.ValueError"
    assert md["runtime_error_traceback"].startswith("Traceback (most recent call last):")
    assert "candidate.py" in md["runtime_error_traceback"]
    assert "correctness_trials" not in md
    assert r["feedback"].startswith("Runtime error in correctness trial 1 of 5.\n")
    assert '  File "candidate.py", line 7, in forward' in r["feedback"]


def test_sys_exit_in_forward_is_a_runtime_error_not_a_dead_worker(harness: Harness) -> None:
    source = candidate(
        """
        import sys
        class ModelNew(nn.Module):
            def forward(self, a, b):
                sys.exit(4)
        """
    )
    r = harness.evaluate(source)
    assert r["status"] == "runtime_error"
    assert r["metadata"]["runtime_error_name"] == "builtins.SystemExit"


def test_init_runtime_error_is_compiled_true(harness: Harness) -> None:
    source = candidate(
        """
        class ModelNew(nn.Module):
            def __init__(self):
                super().__init__()
                raise RuntimeError("x" * 300)
        """
    )
    r = harness.evaluate(source)
    assert (r["status"], r["compiled"], r["correctness"]) == ("runtime_error", True, False)
    # Untruncated, no traceback key: KernelBench stores the exception itself here.
    assert r["metadata"] == {
        "hardware": HARDWARE,
        "device": "cpu",
        "runtime_error": "x" * 300,
        "runtime_error_name": "builtins.RuntimeError",
    }


def test_init_type_error_escapes_like_kernelbench(harness: Harness) -> None:
    source = candidate(
        """
        class ModelNew(nn.Module):
            def __init__(self, features):
                super().__init__()
        """
    )
    r = harness.evaluate(source)
    assert (r["status"], r["compiled"], r["correctness"]) == ("runtime_error", False, False)
    assert r["metadata"] == {
        "other_error": "error: ModelNew.__init__() missing 1 required positional argument: 'features'",
        "other_error_name": "builtins.TypeError",
        "hardware": HARDWARE,
        "device": "cpu",
    }
    assert r["feedback"].startswith("ModelNew(*get_init_inputs()) failed")


def test_compile_errors_in_evaluate(harness: Harness) -> None:
    for name in ("syntax_error.py", "no_modelnew.py"):
        r = harness.evaluate((HOSTILE / name).read_text())
        assert (r["status"], r["compiled"]) == ("compile_error", False)
        assert r["metadata"] == {
            "hardware": HARDWARE,
            "device": "cpu",
            "compilation_error_name": "SyntaxError",
            "compilation_error": "Syntax error in custom generated code or ModelNew not found",
        }
    r = harness.evaluate("import torch\nimport not_a_real_module_xyz\n")
    assert r["metadata"]["compilation_error_name"] == "builtins.ModuleNotFoundError"
    assert r["metadata"]["compilation_error"] == "No module named 'not_a_real_module_xyz'"


BROKEN_FORWARD = ADD.replace("return a + b", "raise RuntimeError('reference broke')")
BROKEN_INIT = ADD.replace("super(Model, self).__init__()", "raise ValueError('no init')")


def test_reference_failures(harness: Harness) -> None:
    r = harness.evaluate(CORRECT, problem=BROKEN_FORWARD)
    assert (r["status"], r["compiled"], r["correctness"]) == ("reference_error", True, False)
    assert r["metadata"]["runtime_error"] == "reference broke"
    assert r["metadata"]["runtime_error_name"] == "builtins.RuntimeError"
    assert "not your code's fault" in r["feedback"]
    r = harness.evaluate(CORRECT, problem=BROKEN_INIT)
    assert (r["status"], r["compiled"]) == ("reference_error", False)
    assert r["metadata"]["other_error"] == "error: no init"
    # A compile error still wins over a broken reference forward (KernelBench loads the candidate first).
    r = harness.evaluate((HOSTILE / "syntax_error.py").read_text(), problem=BROKEN_FORWARD)
    assert r["status"] == "compile_error"


COUNTING = ADD.replace(
    "        return a + b",
    "        type(self).calls = getattr(type(self), 'calls', 0) + 1\n        return a + b",
)


def _context(harness: Harness, mode: str = "faithful") -> kb_eval.ProblemContext:
    (ctx,) = [c for c in harness.worker.references.contexts.values() if c.mode == mode]
    return ctx


def test_the_reference_runs_once_per_problem(harness: Harness) -> None:
    assert harness.evaluate(CORRECT, problem=COUNTING, measure=False)["status"] == "correct"
    ctx = _context(harness)
    assert ctx.problem is not None
    # Five trials, and the precision probe once per problem: the reference on signed inputs, in float32
    # and in float64 (a copy of the same model).
    first = ctx.problem.model.calls
    assert first == 5 + 2
    for _ in range(2):
        assert harness.evaluate(CORRECT, problem=COUNTING, measure=False)["status"] == "correct"
    assert ctx.problem.model.calls == first


def test_inputs_modified_by_a_candidate_are_restored_for_the_next(harness: Harness) -> None:
    inplace = (HOSTILE / "inplace_input.py").read_text()
    r = harness.evaluate(inplace, problem=COUNTING, measure=False)
    # KernelBench accepts it: the reference already ran on the same tensors.
    assert r["status"] == "correct"
    assert "wrote into its input tensors (trials 1, 2, 3, 4, 5)" in r["feedback"]
    # It wrote into the copies it was lent: the worker's cached inputs never changed.
    ctx = _context(harness)
    assert all(entry is not None and not entry.dirty for entry in ctx.trials[5])
    r = harness.evaluate(CORRECT, problem=COUNTING, measure=False)
    assert r["status"] == "correct", r["feedback"]
    for entry, seed in zip(ctx.trials[5], kb_eval.trial_seeds(42, 5), strict=True):
        assert entry is not None and not entry.dirty
        kb_eval.set_seed(seed)
        fresh = [torch.rand(64, 64), torch.rand(64, 64)]
        assert all(torch.equal(a, b) for a, b in zip(entry.inputs or [], fresh, strict=True))
    assert ctx.problem is not None and ctx.problem.model.calls == 5 + 2  # nothing rebuilt (+2: precision probe)


def test_identity_reference_keeps_kernelbench_aliasing_without_corrupting_the_cache(harness: Harness) -> None:
    identity = ADD.replace("return a + b", "return a")
    writer = candidate(
        """
        class ModelNew(nn.Module):
            def forward(self, a, b):
                a.add_(1.0)
                return a - 1.0
        """
    )
    honest = CORRECT.replace("torch.add(a, b)", "a.clone()")
    # KernelBench's expected output is the input tensor itself, which the writer moved by +1.
    assert (
        harness.evaluate(writer, problem=identity, measure=False)["metadata"]["max_difference"]
        == ["1.000000"] * 5
    )
    assert harness.evaluate(honest, problem=identity, measure=False)["status"] == "correct"
    assert harness.evaluate(writer, problem=identity, measure=False, mode="strict")["status"] == "incorrect"
    assert harness.evaluate(honest, problem=identity, measure=False, mode="strict")["status"] == "correct"


def test_timing_inputs_modified_during_timing_are_regenerated(harness: Harness) -> None:
    assert harness.evaluate((HOSTILE / "inplace_input.py").read_text())["status"] == "correct"
    ctx = _context(harness)
    kb_eval.set_seed(42)
    fresh = [torch.rand(64, 64), torch.rand(64, 64)]
    inputs = ctx.timing_inputs()
    assert all(torch.equal(a, b) for a, b in zip(inputs, fresh, strict=True))


DROPOUT = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, p):
        super(Model, self).__init__()
        self.dropout = nn.Dropout(p)

    def forward(self, x):
        return self.dropout(x) * 2.0


def get_inputs():
    return [torch.rand(16, 16)]


def get_init_inputs():
    return [0.5]
"""

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


def kernelbench_order_diffs(problem: str, candidate_source: str, device: str = "cpu") -> list[str]:
    """KernelBench's interleaved order, written out plainly (no cache): per trial seed, inputs, seed,
    seed, reference forward, candidate forward on the same tensors. Returns the max_difference list.
    (Also used by run_gpu_checks.py with device="cuda:0".)"""
    ns: dict[str, Any] = {}
    exec(problem, ns)
    cand: dict[str, Any] = {}
    exec(candidate_source, cand)
    kb_eval.set_seed(42)
    init = ns["get_init_inputs"]()
    with torch.no_grad():
        kb_eval.set_seed(42)
        model = ns["Model"](*init)
        kb_eval.set_seed(42)
        model_new = cand["ModelNew"](*init)
    model, model_new = model.to(device), model_new.to(device)
    diffs: list[str] = []
    with torch.no_grad():
        for seed in kb_eval.trial_seeds(42, 5):
            kb_eval.set_seed(seed)
            inputs = [x.to(torch.float32).to(device) for x in ns["get_inputs"]()]
            kb_eval.set_seed(seed)
            kb_eval.set_seed(seed)
            out = model(*inputs)
            out_new = model_new(*inputs)
            if not torch.allclose(out, out_new, atol=1e-4, rtol=1e-4):
                diffs.append(f"{torch.max(torch.abs(out - out_new)).item():.6f}")
    return diffs


def test_rng_consuming_forward_matches_kernelbench_order_fresh_and_cached(harness: Harness) -> None:
    expected = kernelbench_order_diffs(DROPOUT, DROPOUT_CANDIDATE)
    assert len(expected) == 5  # different dropout masks: KernelBench fails this candidate in every trial
    first = harness.evaluate(DROPOUT_CANDIDATE, problem=DROPOUT, measure=False)
    second = harness.evaluate(DROPOUT_CANDIDATE, problem=DROPOUT, measure=False)
    assert first["metadata"]["max_difference"] == expected
    assert second["metadata"] == first["metadata"]


def test_memory_tiers_give_identical_results(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    baseline = harness.evaluate(DROPOUT_CANDIDATE, problem=DROPOUT, measure=False)["metadata"]
    for budgets in [(0, 10**9), (0, 0)]:  # host tier (as for an oversized CUDA problem), then recompute
        monkeypatch.setattr(kb_reference, "memory_budgets", lambda device, b=budgets: b)
        other = Harness(harness.root / f"tier{budgets[1]}")
        assert other.evaluate(DROPOUT_CANDIDATE, problem=DROPOUT, measure=False)["metadata"] == baseline
        assert other.evaluate(DROPOUT_CANDIDATE, problem=DROPOUT, measure=False)["metadata"] == baseline
        tiers = {e.tier for e in _context(other).trials[5] if e is not None}
        assert tiers == {"host" if budgets[1] else "recompute"}


def test_device_inputs_tier_recomputes_the_reference_with_identical_results(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    baseline = harness.evaluate(DROPOUT_CANDIDATE, problem=DROPOUT, measure=False)["metadata"]
    ctx = _context(harness)
    entry = ctx.trials[5][0]
    assert entry is not None and entry.inputs is not None
    in_size, size = kb_tensors.nbytes(entry.inputs), kb_tensors.nbytes(entry.inputs) + kb_tensors.nbytes(entry.output)
    # Room for five trials' inputs plus the timing inputs, not for five outputs as well.
    budget = 6 * in_size
    assert 5 * size + in_size > budget
    monkeypatch.setattr(kb_reference, "memory_budgets", lambda device: (budget, 0))
    other = Harness(harness.root / "lean")
    for _ in range(2):
        assert other.evaluate(DROPOUT_CANDIDATE, problem=DROPOUT, measure=False)["metadata"] == baseline
    assert [e.tier for e in _context(other).trials[5] if e is not None] == ["device_inputs"] * 5


def test_placement_looks_ahead_instead_of_filling_up_with_outputs(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    harness.evaluate(CORRECT, problem=COUNTING, measure=False)
    entry = _context(harness).trials[5][0]
    assert entry is not None
    in_size = kb_tensors.nbytes(entry.inputs)
    size = in_size + kb_tensors.nbytes(entry.output)
    cache = kb_eval.ReferenceCache()
    ctx = cache.context(kb_reference.ReferenceSpec(COUNTING, torch.device("cpu"), "fp32", "faithful", 42))
    monkeypatch.setattr(kb_reference, "memory_budgets", lambda device: (5 * in_size + in_size, 10**9))
    assert cache.place(ctx, in_size, size, 5, lean_ok=True) == "device_inputs"
    assert cache.place(ctx, in_size, size, 5, lean_ok=False) == "device"  # greedy: the first fits whole
    monkeypatch.setattr(kb_reference, "memory_budgets", lambda device: (5 * size + in_size, 10**9))
    assert cache.place(ctx, in_size, size, 5, lean_ok=True) == "device"
    monkeypatch.setattr(kb_reference, "memory_budgets", lambda device: (0, 10**9))
    assert cache.place(ctx, in_size, size, 5, lean_ok=True) == "host"


def test_prepare_builds_the_reference_so_evaluate_only_checks(harness: Harness) -> None:
    first = kb_prepare.prepare(prepare_request(1, COUNTING), harness.worker)
    assert kb_protocol.check_response(first) == []
    assert first["status"] == "ready" and first["tiers"] == ["device"] * 5 and first["device_bytes"] > 0
    ctx = _context(harness)
    assert ctx.problem is not None and ctx.problem.model.calls == 5 + 104  # 5 trials, then timed once
    again = kb_prepare.prepare(prepare_request(2, COUNTING), harness.worker)
    # Nothing is built twice: the reference ran no further forward (never compare wall-clock times).
    assert again["status"] == "ready" and ctx.problem.model.calls == 5 + 104
    r = harness.evaluate(CORRECT, problem=COUNTING)
    assert r["status"] == "correct" and r["ref_runtime_source"] == "cached"
    # Nothing rebuilt; the only forwards are faithful mode's fresh-input probe's checks after timing.
    # The evaluate adds the worker's fresh calls (one forward for the output's shape, one per checked call)
    # and the precision probe (float32 and float64 forwards), once per problem.
    assert ctx.problem.model.calls == 5 + 104 + 1 + kb_drive.PROBE_CALLS + 2


def test_large_inputs_are_made_in_parallel_bit_for_bit(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    serial = kb_prepare.prepare(prepare_request(1, DROPOUT), harness.worker)
    assert serial["parallel_inputs"] == 0  # tiny inputs: processes would cost more than they save
    monkeypatch.setattr(kb_inputs, "PARALLEL_MIN_BYTES", 0)
    other = Harness(harness.root / "parallel")
    parallel = kb_prepare.prepare(prepare_request(1, DROPOUT), other.worker)
    assert parallel["status"] == "ready" and parallel["parallel_inputs"] >= 2, parallel
    made, reference = _context(other), _context(harness)
    for index in range(5):
        a, b = made.trials[5][index], reference.trials[5][index]
        assert a is not None and b is not None and a.inputs is not None and b.inputs is not None
        assert all(torch.equal(x, y) for x, y in zip(a.inputs, b.inputs, strict=True))
        assert torch.equal(a.output, b.output)
    assert made.pregenerated == {}
    baseline = harness.evaluate(DROPOUT_CANDIDATE, problem=DROPOUT, measure=False)["metadata"]
    assert other.evaluate(DROPOUT_CANDIDATE, problem=DROPOUT, measure=False)["metadata"] == baseline


def test_input_sizes_are_planned_on_the_meta_device() -> None:
    problem = kb_eval.load_problem(ADD)
    raw = problem.get_inputs()
    assert kb_inputs.planned_bytes(problem.get_inputs) == sum(t.numel() * 4 for t in raw)
    explicit = kb_eval.load_problem(ADD.replace("torch.rand(N, N)", "torch.rand(N, N, device='cpu')"))
    assert kb_inputs.planned_bytes(explicit.get_inputs) is None  # made for real: size unknown ahead
    failing = kb_eval.load_problem(ADD.replace("    a = torch.rand(N, N)", "    a = torch.rand(N, N)\n    a.item()"))
    assert kb_inputs.planned_bytes(failing.get_inputs) is None
    assert kb_inputs.how_many_in_parallel(None, 6) == 0
    assert kb_inputs.how_many_in_parallel(1 << 30, 1) == 0
    assert kb_inputs.how_many_in_parallel(1 << 20, 6) == 0  # 6 MiB in all: serial


def test_prepare_reports_a_broken_reference(harness: Harness) -> None:
    broken = ADD.replace("return a + b", "raise ValueError('reference is broken')")
    r = kb_prepare.prepare(prepare_request(1, broken), harness.worker)
    assert kb_protocol.check_response(r) == []
    assert r["status"] == "reference_error" and "reference is broken" in r["feedback"]
    assert harness.evaluate(CORRECT, problem=broken)["status"] == "reference_error"


OOM_ONCE = candidate(
    """
    import os

    # Its build folder: the one place a candidate process may write that outlives the process (each
    # job's scratch folder is its own and removed after it).
    MARK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "oom-once")

    class ModelNew(nn.Module):
        def forward(self, a, b):
            if not os.path.exists(MARK):
                open(MARK, "w").close()
                raise torch.OutOfMemoryError("CUDA out of memory.")
            return torch.add(a, b)
    """
)


def test_out_of_memory_next_to_cached_data_is_retried_off_the_device(
    harness: Harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert harness.evaluate(CORRECT, problem=COUNTING, measure=False)["status"] == "correct"
    assert harness.worker.references.device_bytes(torch.device("cpu")) > 0
    r = harness.evaluate(OOM_ONCE, problem=COUNTING, measure=False)
    assert r["status"] == "correct" and r["metadata"]["retried_without_device_cache"] is True
    assert "second time" in r["feedback"]
    ctx = _context(harness)
    assert not ctx.device_cache and {e.tier for e in ctx.trials[5] if e is not None} == {"recompute"}
    # With nothing cached on the device, an out-of-memory verdict stands (a new build folder: no mark).
    assert harness.evaluate(OOM_ONCE, problem=COUNTING, measure=False)["status"] == "out_of_memory"


def test_an_allocation_no_cache_could_explain_is_not_retried(harness: Harness) -> None:
    assert harness.evaluate(CORRECT, problem=COUNTING, measure=False)["status"] == "correct"
    r = harness.evaluate((HOSTILE / "huge_alloc.py").read_text(), problem=COUNTING, measure=False)
    assert r["status"] == "out_of_memory" and "retried_without_device_cache" not in r["metadata"]
    assert _context(harness).device_cache


def test_oom_request_sizes_are_read_from_torch_messages() -> None:
    assert kb_correctness.oom_request_bytes("CUDA out of memory. Tried to allocate 6.00 GiB. GPU 0 has") == 6 << 30
    assert kb_correctness.oom_request_bytes("can't allocate memory: you tried to allocate 4096 bytes.") == 4096
    # What torch 2.11 says on the H100 for torch.empty(2**62) (found there: it used to be retried).
    assert kb_correctness.oom_request_bytes("CUDA out of memory. Tried to allocate more than 1EB memory.") == 10**18
    assert kb_correctness.oom_request_bytes("out of memory") is None


def test_other_problems_give_way_to_one_that_ran_out_of_memory(harness: Harness) -> None:
    harness.evaluate(CORRECT, measure=False)
    first = _context(harness)
    harness.evaluate(DROPOUT_CANDIDATE, problem=DROPOUT, measure=False)
    assert len(harness.worker.references.contexts) == 2
    other = next(c for c in harness.worker.references.contexts.values() if c is not first)
    held = other.device_bytes
    assert harness.worker.references.evict_others(first) == held
    assert list(harness.worker.references.contexts.values()) == [first]


def test_contexts_are_evicted_least_recently_used(harness: Harness) -> None:
    harness.worker.references.max_contexts = 1
    harness.evaluate(CORRECT, measure=False)
    harness.evaluate(DROPOUT_CANDIDATE, problem=DROPOUT, measure=False)
    assert len(harness.worker.references.contexts) == 1
    assert _context(harness).problem is not None


INDEXED = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super(Model, self).__init__()

    def forward(self, x, idx):
        return x[idx]


def get_inputs():
    return [torch.rand(32, 8), torch.randint(0, 32, (16,))]


def get_init_inputs():
    return []
"""


def test_integer_inputs_are_kept_in_both_modes_and_cast_on_request(harness: Harness) -> None:
    source = candidate(
        """
        class ModelNew(nn.Module):
            def forward(self, x, idx):
                return torch.index_select(x, 0, idx)
        """
    )
    for mode in ("faithful", "strict"):
        kept = harness.evaluate(source, problem=INDEXED, measure=False, mode=mode)
        assert kept["status"] == "correct", kept["feedback"]
        assert (kept["env"]["mode"], kept["env"]["integer_inputs"]) == (mode, "kept")
    # eval.cast_integer_inputs: KernelBench's cast breaks the reference (its issue #151).
    cast = harness.evaluate(source, problem=INDEXED, measure=False, cast_integer_inputs=True)
    assert cast["status"] == "reference_error"
    assert cast["metadata"]["runtime_error_name"] == "builtins.IndexError"
    assert cast["env"]["integer_inputs"] == "cast"


def test_strict_rejects_input_modification(harness: Harness) -> None:
    r = harness.evaluate((HOSTILE / "inplace_input.py").read_text(), mode="strict")
    assert (r["status"], r["correctness"]) == ("incorrect", False)
    assert r["metadata"]["correctness_issue"] == "Input modified in place: input 0"
    assert r["metadata"]["correctness_issue_name"] == "input_modified"
    assert "modified its input tensor(s) 0 in place in correctness trial 1 of 5" in r["feedback"]
    # The cached inputs themselves stayed pristine (the candidate only saw clones).
    assert harness.evaluate(CORRECT, mode="strict", measure=False)["status"] == "correct"


def test_strict_uninitialised_output_fails(harness: Harness) -> None:
    # An uninitialised output (torch.empty) holds whatever the candidate's own process freed: in strict
    # mode the worker lends empty output buffers and the process poisons freed memory the size of the
    # expected output before every forward, and the expected output never enters that process at all.
    reuse = (HOSTILE / "reuse_freed.py").read_text()
    assert harness.evaluate(reuse, mode="strict", measure=False)["status"] == "incorrect"
    assert harness.evaluate(reuse, measure=False)["status"] == "incorrect"


def test_strict_pins_tf32_off_and_restores_it(harness: Harness) -> None:
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    r = harness.evaluate(CORRECT, mode="strict", measure=False)
    assert (r["env"]["tf32_matmul"], r["env"]["tf32_cudnn"]) == (False, False)
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == before
    half = harness.evaluate(CORRECT, mode="strict", measure=False, precision="fp16")
    assert half["env"]["tf32_cudnn"] == before[1]  # only fp32 is pinned


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_low_precision_casts_and_tolerance(harness: Harness, precision: str) -> None:
    source = candidate(
        """
        class ModelNew(nn.Module):
            def forward(self, a, b):
                assert a.dtype == b.dtype and a.dtype != torch.float32
                return (a.float() + b.float() + 0.004).to(a.dtype)
        """
    )
    r = harness.evaluate(source, precision=precision, measure=False)
    assert r["status"] == "correct", r["feedback"]
    assert "atol = rtol = 0.01" in r["feedback"]
    assert r["env"]["precision"] == precision


SLOW_REFERENCE = ADD.replace(
    "        return a + b", "        import time\n        time.sleep(0.002)\n        return a + b"
)


def test_excessive_speedup_is_flagged_at_the_guards_bound_only(harness: Harness) -> None:
    # One threshold for suspicious speedups: the guard's bound (here eval.max_speedup = 5), in the
    # metadata, the feedback and the speedup check alike; no second, fixed 10x.
    r = harness.evaluate(CORRECT, problem=SLOW_REFERENCE, timing_trials=5, max_speedup=5.0)
    assert r["status"] == "correct"
    assert r["speedup"] > 10
    assert r["speedup_check"]["flagged"] is True and r["speedup_check"]["bound"] == 5.0
    assert r["metadata"]["excessive_speedup"] is True
    assert "above what this problem's reference allows on this device (5.0x, config)" in r["feedback"]
    # No fixed 10x named; the measured speedup itself may read "487.10x" (a substring test failed on it).
    assert re.search(r"(?<![\d.])10(\.0+)?x", r["feedback"]) is None, r["feedback"]
    # Above 10x but within the bound: nothing flagged anywhere.
    r = harness.evaluate(CORRECT, problem=SLOW_REFERENCE, timing_trials=5, max_speedup=1e9)
    assert r["speedup"] > 10 and r["speedup_check"]["flagged"] is False
    assert "excessive_speedup" not in r["metadata"]
    assert "flagged" not in r["feedback"] and "suspicious" not in r["feedback"]


def test_a_wild_reference_timing_is_timed_again_and_the_steadiest_kept() -> None:
    def stats(fastest: float, median: float, mean: float) -> dict[str, float]:
        return {"min": fastest, "median": median, "mean": mean}

    # 14.5 ms typical against a fastest call of 0.11 ms (the case): wild; so is a mean
    # that a few very slow calls make.
    assert kb_eval.timing_spread(stats(0.11, 16.1, 14.45)) > kb_eval.WILD_SPREAD
    assert kb_eval.timing_spread(stats(1.0, 1.1, 4.0)) > kb_eval.WILD_SPREAD
    assert kb_eval.timing_spread(stats(1.0, 1.05, 1.2)) <= kb_eval.WILD_SPREAD
    runs = iter([stats(0.1, 16.0, 14.0), stats(0.1, 0.5, 0.6), stats(0.1, 0.12, 0.13), stats(9, 9, 9)])
    measured: list[dict[str, float]] = []

    def measure() -> dict[str, float]:
        measured.append(next(runs))
        return measured[-1]

    # Wild, then still wild (less so), then steady: timed three times, the steady one kept.
    assert kb_eval.steadiest(measure, lambda s: s) == stats(0.1, 0.12, 0.13)
    assert len(measured) == 3
    # Steady at once: timed once.
    measured.clear()
    runs = iter([stats(1.0, 1.0, 1.0)])
    assert kb_eval.steadiest(measure, lambda s: s) == stats(1.0, 1.0, 1.0) and len(measured) == 1
    # Wild every time: WILD_RETIMES more timings, the steadiest kept.
    measured.clear()
    runs = iter([stats(0.1, 9.0, 9.0), stats(0.1, 5.0, 5.0), stats(0.1, 7.0, 7.0)])
    assert kb_eval.steadiest(measure, lambda s: s) == stats(0.1, 5.0, 5.0)
    assert len(measured) == 1 + kb_eval.WILD_RETIMES


def test_checksum_sees_one_changed_element() -> None:
    x = torch.rand(1000, 3)
    before = kb_tensors.fingerprint([x, 7])
    assert kb_tensors.fingerprint([x, 7]) == before
    x[999, 2] += 1.0
    assert kb_tensors.fingerprint([x, 7]) != before
    # Swapping two elements keeps the plain sum but not the position-weighted checksum.
    y = torch.arange(10, dtype=torch.float32)
    z = y.clone()
    z[[0, 1]] = z[[1, 0]]
    assert kb_eval.tensor_checksum(y) != kb_eval.tensor_checksum(z)
    odd = torch.ones(3, dtype=torch.uint8)  # byte count not a multiple of 4
    assert kb_eval.tensor_checksum(odd) != kb_eval.tensor_checksum(torch.zeros(3, dtype=torch.uint8))
    # The device path (a weighted sum computed where the tensor lives), exercised here on the CPU.
    weighted = kb_tensors.weighted_checksum
    as_bytes = lambda t: t.reshape(-1).view(torch.uint8)  # noqa: E731 - a one-line helper beside its use
    assert weighted(as_bytes(y)) != weighted(as_bytes(z))
    w = torch.rand(1000, 3)
    before_w = weighted(as_bytes(w))
    w[500, 1] += 1.0
    assert weighted(as_bytes(w)) != before_w
    assert weighted(odd) != weighted(torch.zeros(3, dtype=torch.uint8))


def test_same_bytes_treats_nan_as_equal_to_itself() -> None:
    a = torch.tensor([float("nan"), 1.0])
    assert kb_eval.same_bytes(a, a.clone())
    assert not kb_eval.same_bytes(a, torch.tensor([float("nan"), 2.0]))


def test_prepare_value_casting_rules() -> None:
    cpu = torch.device("cpu")
    idx = torch.tensor([1, 2])
    # Default: integer and bool tensors keep their dtype; floating ones take the precision.
    assert kb_eval.prepare_value(idx, cpu, torch.float16).dtype == torch.int64
    assert kb_eval.prepare_value(torch.tensor([True]), cpu, torch.float32).dtype == torch.bool
    assert kb_eval.prepare_value(torch.zeros(2), cpu, torch.float16).dtype == torch.float16
    # eval.cast_integer_inputs: KernelBench's cast of every tensor.
    assert kb_eval.prepare_value(idx, cpu, torch.float16, cast_integers=True).dtype == torch.float16
    assert kb_eval.prepare_value(torch.tensor([True]), cpu, torch.bfloat16, True).dtype == torch.bfloat16
    assert kb_eval.prepare_value(3, cpu, torch.float16) == 3
    assert kb_eval.integer_inputs_policy(False) == "kept"
    assert kb_eval.integer_inputs_policy(True) == "cast"


def test_models_are_never_put_in_eval_mode(harness: Harness) -> None:
    source = candidate(
        """
        class ModelNew(nn.Module):
            def forward(self, a, b):
                assert self.training, "KernelBench never calls .eval()"
                return a + b
        """
    )
    assert harness.evaluate(source, measure=False)["status"] == "correct"


def test_module_level_parameters_follow_rng_replay(harness: Harness) -> None:
    problem = ADD.replace(
        "        super(Model, self).__init__()",
        "        super(Model, self).__init__()\n        self.w = nn.Parameter(torch.randn(64))",
    ).replace("return a + b", "return a + b * self.w")
    same_init = candidate(
        """
        class ModelNew(nn.Module):
            def __init__(self):
                super().__init__()
                self.w = nn.Parameter(torch.randn(64))
            def forward(self, a, b):
                return a + b * self.w
        """
    )
    assert harness.evaluate(same_init, problem=problem, measure=False)["status"] == "correct"
    other_init = same_init.replace("torch.randn(64)", "torch.rand(64)")
    assert harness.evaluate(other_init, problem=problem, measure=False)["status"] == "incorrect"


def test_mismatch_detail_counts_as_isclose_does() -> None:
    """The feedback's count of failing elements comes from the difference KernelBench's max/avg use;
    it must agree with torch.isclose, NaN and infinities included."""
    inf, nan = float("inf"), float("nan")
    expected = torch.tensor([[1.0, nan, inf, -inf], [2.0, inf, 0.5, 3.0]])
    got = torch.tensor([[1.00001, nan, inf, inf], [3.0, 5.0, 0.5, nan]])
    diff = torch.abs(expected - got)
    detail = kb_correctness.mismatch_detail(1, expected, got, 1e-4, 1e-4, diff)
    assert detail is not None
    assert detail.bad == int((~torch.isclose(expected, got, rtol=1e-4, atol=1e-4)).sum())
    assert detail.first_index == (0, 1) and detail.total == 8
    assert detail.nonfinite == int((~torch.isfinite(got) & torch.isfinite(expected)).sum())
