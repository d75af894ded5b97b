"""Timing statistics and the CPU timer's loop structure."""

from __future__ import annotations

import math

import pytest
import torch

import kb_timing


def test_stats_are_population_statistics_at_full_precision() -> None:
    stats = kb_timing.runtime_stats([1.0, 2.0, 3.0, 4.0])
    assert stats == {
        "mean": 2.5,
        "median": 2.5,
        "std": math.sqrt(1.25),
        "min": 1.0,
        "max": 4.0,
        "num_trials": 4,
    }
    # Not rounded to 3 significant digits (KernelBench would store 0.123).
    assert kb_timing.runtime_stats([0.123456])["mean"] == 0.123456


def test_kernelbench_rounding_is_three_significant_digits() -> None:
    assert kb_timing.kernelbench_rounded({"mean": 0.123456, "num_trials": 100}) == {
        "mean": 0.123,
        "num_trials": 100,
    }
    assert kb_timing.kernelbench_rounded({"mean": 12345.6}) == {"mean": 12300.0}


def test_cpu_timer_runs_warmups_then_discards_the_first_timed_call() -> None:
    calls: list[bool] = []

    def fn(x: torch.Tensor) -> torch.Tensor:
        calls.append(torch.is_grad_enabled())
        return x + 1

    times = kb_timing.time_cpu(fn, [torch.ones(4)], warmup=3, trials=10, discard_first=1)
    assert len(calls) == 3 + 10 + 1
    assert len(times) == 10
    assert all(t >= 0.0 for t in times)
    assert not any(calls), "timing must run under no_grad"


def test_time_callable_dispatches_on_device_and_reads_the_request_fields() -> None:
    count = [0]

    def fn() -> None:
        count[0] += 1

    timing = {"measure": True, "warmup": 2, "trials": 5, "discard_first": 2, "l2_flush": True}
    times = kb_timing.time_callable(fn, [], torch.device("cpu"), timing, kb_timing.L2Flusher())
    assert len(times) == 5 and count[0] == 2 + 5 + 2
    assert kb_timing.timing_method(torch.device("cpu")) == "cpu_perf_counter"
    assert kb_timing.timing_method(torch.device("cuda", 0)) == "cuda_event"


def test_a_patched_perf_counter_never_reaches_the_cpu_timer(monkeypatch: pytest.MonkeyPatch) -> None:
    # What the integrity fixture timer_patch.py does at import: the loop must keep the clock it captured.
    import time

    calls: list[int] = []

    def patched() -> float:
        calls.append(1)
        return 0.0

    monkeypatch.setattr(time, "perf_counter", patched)
    times = kb_timing.time_cpu(lambda: None, (), warmup=1, trials=3, discard_first=1)
    assert len(times) == 3 and calls == []
    assert kb_timing.patched_functions() == ["time.perf_counter"]
