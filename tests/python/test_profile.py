"""The P signal: profiler-table trimming, ncu CSV parsing, and the reference data a profile runs on."""

from __future__ import annotations

from pathlib import Path

import pytest

import kb_profile
import kb_reference
import kb_store
from harness_client import HOSTILE, profile_request

RULE = "-" * 40


def _table(rows: int) -> str:
    body = [f"{'aten::op_' + str(i):>30}  {i:>8}" for i in range(rows)]
    return "\n".join(
        [RULE, f"{'Name':>30}  {'Calls':>8}", RULE, *body, RULE, "Self CPU time total: 1.000ms", ""]
    )


def test_short_tables_are_untouched() -> None:
    table = _table(3)
    assert kb_profile.trim_table(table, 4000) == table


def test_long_tables_lose_rows_from_the_bottom_but_keep_header_and_totals() -> None:
    trimmed = kb_profile.trim_table(_table(500), 1000)
    lines = trimmed.splitlines()
    assert len(trimmed) <= 1000
    assert lines[:3] == [RULE, f"{'Name':>30}  {'Calls':>8}", RULE]
    assert lines[3].strip().startswith("aten::op_0")
    assert lines[-3:] == ["(more rows not shown)", RULE, "Self CPU time total: 1.000ms"]


# Columns and values as ncu 2025 printed them on an H100 (`--csv --page raw --print-units base`, most
# columns dropped), plus a second kernel to check the duration weighting.
NCU_CSV = """==PROF== Connected to process 637 (/usr/bin/python3.12)
"ID","Kernel Name","dram__throughput.avg.pct_of_peak_sustained_elapsed","gpu__time_duration.sum","sm__throughput.avg.pct_of_peak_sustained_elapsed","sm__warps_active.avg.pct_of_peak_sustained_active"
"","","%","ns","%","%"
"0","void vectorized_elementwise_kernel<4, CUDAFunctor_add<float>, array<char *, 3>>(int, T2, T3)","0.42","2,784","0.04","6.14"
"1","my_kernel(float*)","10.42","1,216","50.04","80.00"
==PROF== Disconnected from process 637
"""


def test_ncu_csv_is_summed_and_duration_weighted() -> None:
    metrics = kb_profile.parse_ncu_csv(NCU_CSV)
    assert metrics["duration_ns"] == 4000.0
    assert metrics["num_kernels"] == 2
    assert metrics["dram_throughput_pct"] == (0.42 * 2784 + 10.42 * 1216) / 4000
    assert metrics["sm_throughput_pct"] == (0.04 * 2784 + 50.04 * 1216) / 4000
    assert metrics["achieved_occupancy"] == (6.14 * 2784 + 80.0 * 1216) / 4000


def test_ncu_output_without_kernels_is_an_error() -> None:
    with pytest.raises(ValueError, match="no kernel rows"):
        kb_profile.parse_ncu_csv("==PROF== Disconnected\n")


def test_a_profile_works_against_the_runs_reference_data(tmp_path: Path) -> None:
    """The profiled forward runs on the run's reference data: its seed, mode and stored inputs, as the
    request's reference spec says (it once took seed 42 and faithful mode whatever the run used, and drew
    its inputs itself even where the store held them)."""
    code = (HOSTILE / "problem_add.py").read_text()
    entry = {"code": code, "seed": 7, "trials": 5, "timing": True, "entry": str(tmp_path / "entry")}
    assert kb_store.generate({**entry, "tmp": str(tmp_path / ".tmp")})["status"] == "generated"
    candidate = code.replace("Model", "ModelNew")
    request = profile_request(1, code, candidate, tmp_path / "build")
    request.update(seed=7, mode="strict", stored_inputs=entry["entry"])
    (tmp_path / "build").mkdir()
    cache = kb_reference.ReferenceCache()
    result = kb_profile.profile(request, cache, str(tmp_path))
    assert result["status"] == "ok", result["note"]
    (ctx,) = cache.contexts.values()
    assert (ctx.seed, ctx.mode, ctx.stored) == (7, "strict", entry["entry"])
    assert ctx.counts["stored_inputs"] == 1 and ctx.counts["timing_inputs"] == 1
