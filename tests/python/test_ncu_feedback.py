"""The Nsight Compute section of the P feedback, rendered from recorded `ncu --csv --page raw
--print-units base` output (three kernels of one forward on an H100: a GEMM, an elementwise ReLU and
a PyTorch reduction)."""

from __future__ import annotations

from pathlib import Path

import pytest

import kb_ncu
from harness_client import FIXTURES

RAW = (FIXTURES / "ncu" / "raw_page_h100.csv").read_text()
# H100 SXM: 67 TFLOP/s fp32 (non-tensor), 3350 GB/s HBM3.
PEAK_TFLOPS, PEAK_GBS = 67.0, 3350.0


def test_kernels_are_read_with_names_and_metrics() -> None:
    kernels = kb_ncu.parse_kernels(RAW)
    assert [kb_ncu._short(k.name) for k in kernels] == ["void gemm_kernel", "relu_kernel", "void at::native::reduce_kernel"]
    gemm = kernels[0]
    assert gemm.duration_ns == 2_000_000
    assert gemm.flops() == 80_000_000_000  # an FFMA is two FLOPs
    assert gemm.dram_bytes() == 200_000_000
    assert gemm.metrics["sm__cycles_active.avg"] == 3_410_112


def test_rendered_section_leads_with_kernelbench_metrics_and_ranks_kernels() -> None:
    text = kb_ncu.section(RAW, PEAK_TFLOPS, PEAK_GBS)
    assert text.splitlines() == [
        "Nsight Compute: 3 kernel launch(es), 2600 us of GPU time in one forward.",
        (
            "  sm__cycles_active.avg = 4.411e+06, sm__cycles_elapsed.sum = 5.978e+08, "
            "gpu__time_duration.sum = 2.6e+06, smsp__inst_executed_pipe_tensor_op_hmma.sum = 0 (summed over kernels)"
        ),
        "  Top kernels by time (3 of 3):",
        "  - void gemm_kernel: 2000 us (77%), occupancy 49%",
        "    40 TFLOP/s (60% of 67 T), 100 GB/s (3% of 3.35 TB/s), AI 400 FLOP/B >= ridge 20: compute-bound, 60% of SOL",
        "  - relu_kernel: 500 us (19%), occupancy 91%",
        "    0 FLOP/s (0% of 67 T), 3.2 TB/s (96% of 3.35 TB/s), AI 0 FLOP/B < ridge 20: memory-bound, 96% of SOL",
        "  - void at::native::reduce_kernel: 100 us (4%), occupancy 23%",
        "    10 GFLOP/s (0% of 67 T), 400 GB/s (12% of 3.35 TB/s), AI 0.025 FLOP/B < ridge 20: memory-bound, 12% of SOL",
    ]


def test_unknown_gpu_has_rates_without_a_bound() -> None:
    text = kb_ncu.section(RAW, None, None)
    assert "    40 TFLOP/s, 100 GB/s, bound unknown (no peak numbers for this GPU)" in text.splitlines()


@pytest.mark.parametrize(
    ("output", "reason"),
    [
        ("==PROF== Connected to process 1\n==PROF== Disconnected from process 1\n", "no kernel rows"),
        ('"ID","Kernel Name"\n"",""\n"0","k"\n', "gpu__time_duration.sum missing"),
    ],
)
def test_unreadable_output_is_one_line(output: str, reason: str) -> None:
    text = kb_ncu.section(output, PEAK_TFLOPS, PEAK_GBS)
    assert text.startswith("Nsight Compute: counters unavailable (could not read ncu output: ")
    assert reason in text and "\n" not in text


def test_only_the_top_kernels_are_listed() -> None:
    text = kb_ncu.render(kb_ncu.parse_kernels(RAW), PEAK_TFLOPS, PEAK_GBS, top=1)
    assert "Top kernels by time (1 of 3):" in text
    assert "relu_kernel" not in text


def test_sol_fraction_is_the_duration_weighted_mean_of_each_kernels_roof() -> None:
    kernels = kb_ncu.parse_kernels(RAW)
    # gemm: compute-bound, 40 TFLOP/s of 67; relu: memory-bound, 3.2 TB/s of 3.35; reduce: memory-bound,
    # 40,000,512 bytes in 100 us of 3.35 TB/s; weighted by 2000, 500 and 100 us.
    sols = [kb_ncu.kernel_sol(k, PEAK_TFLOPS, PEAK_GBS) for k in kernels]
    assert [s[0] for s in sols if s] == [False, True, True]
    assert [s[1] for s in sols if s] == pytest.approx([40 / 67, 3.2 / 3.35, 0.40000512 / 3.35], rel=1e-12)
    want = (2000 * 40 / 67 + 500 * 3.2 / 3.35 + 100 * 0.40000512 / 3.35) / 2600
    got = kb_ncu.sol_fraction(kernels, PEAK_TFLOPS, PEAK_GBS)
    assert got == pytest.approx(want, rel=1e-12)
    assert kb_ncu.sol_fraction(kernels, None, None) is None


def test_profile_metrics_carry_the_forwards_sol_fraction(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """What the P feedback records for report's `sol_mean`: ncu's recorded output in place of a run of
    ncu (which needs a GPU), read into the profile's metrics."""
    import torch

    import kb_profile

    monkeypatch.setattr(kb_profile, "run_ncu_raw", lambda request, device, scratch: (RAW, None))
    request = {"peaks": {"peak_tflops": PEAK_TFLOPS, "peak_bandwidth_gbs": PEAK_GBS}}
    metrics, note, section = kb_profile.ncu_feedback(request, torch.device("cpu"), str(tmp_path))
    assert note is None and metrics is not None
    assert metrics["num_kernels"] == 3
    assert metrics["sol_fraction"] == kb_ncu.sol_fraction(kb_ncu.parse_kernels(RAW), PEAK_TFLOPS, PEAK_GBS)
    assert "compute-bound, 60% of SOL" in section
    # No peaks for this GPU: no fraction, the rest as before.
    metrics, _, _ = kb_profile.ncu_feedback({"peaks": None}, torch.device("cpu"), str(tmp_path))
    assert metrics is not None and metrics["sol_fraction"] is None
