"""Nsight Compute feedback for P: per-kernel metrics of one candidate forward, read from
`ncu --csv --page raw --print-units base`, rendered as a few lines a kernel engineer would read.

The metric set is KernelBench's profile.py set (`sm__cycles_active.avg`, `sm__cycles_elapsed.sum`,
`gpu__time_duration.sum`, `smsp__inst_executed_pipe_tensor_op_hmma.sum`) plus what a roofline needs:
floating-point operations (SASS FADD/FMUL/FFMA and their half and double forms, an FMA counted as
two) and DRAM bytes. Each of the top kernels by time gets its achieved FLOP/s and bytes/s against the
GPU's peaks (`prompt::gpu_specs`, sent by the orchestrator), whether its arithmetic intensity puts it
under the memory or the compute roof, and its fraction of that roof (% of speed of light).
Tensor-core work is not in the SASS FP counters; its instruction count is shown instead.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field

# KernelBench's profile.py metrics, in the order shown.
KERNELBENCH_METRICS = (
    "sm__cycles_active.avg",
    "sm__cycles_elapsed.sum",
    "gpu__time_duration.sum",
    "smsp__inst_executed_pipe_tensor_op_hmma.sum",
)
# FLOP counters: (metric, FLOPs per instruction-thread).
FLOP_METRICS = (
    ("sm__sass_thread_inst_executed_op_fadd_pred_on.sum", 1),
    ("sm__sass_thread_inst_executed_op_fmul_pred_on.sum", 1),
    ("sm__sass_thread_inst_executed_op_ffma_pred_on.sum", 2),
    ("sm__sass_thread_inst_executed_op_hadd_pred_on.sum", 1),
    ("sm__sass_thread_inst_executed_op_hmul_pred_on.sum", 1),
    ("sm__sass_thread_inst_executed_op_hfma_pred_on.sum", 2),
    ("sm__sass_thread_inst_executed_op_dadd_pred_on.sum", 1),
    ("sm__sass_thread_inst_executed_op_dmul_pred_on.sum", 1),
    ("sm__sass_thread_inst_executed_op_dfma_pred_on.sum", 2),
)
BYTE_METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum")
OCCUPANCY = "sm__warps_active.avg.pct_of_peak_sustained_active"
METRICS = (*KERNELBENCH_METRICS, *(m for m, _ in FLOP_METRICS), *BYTE_METRICS, OCCUPANCY)
NAME_COLUMN = "Kernel Name"
TOP_KERNELS = 5
NAME_CHARS = 60


@dataclass
class Kernel:
    name: str
    metrics: dict[str, float | None] = field(default_factory=dict)

    @property
    def duration_ns(self) -> float:
        return self.metrics.get("gpu__time_duration.sum") or 0.0

    def flops(self) -> float | None:
        values = [(self.metrics.get(m), per) for m, per in FLOP_METRICS]
        known = [(v, per) for v, per in values if v is not None]
        return sum(v * per for v, per in known) if known else None

    def dram_bytes(self) -> float | None:
        values = [self.metrics.get(m) for m in BYTE_METRICS]
        known = [v for v in values if v is not None]
        return sum(known) if known else None


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def parse_kernels(text: str) -> list[Kernel]:
    """One Kernel per row of ncu's raw CSV page (header row, units row, then one row per launch).
    Lines before the header (the target's own output, ==PROF== notes) are skipped."""
    rows = list(csv.reader(line for line in text.splitlines() if line.startswith('"')))
    if len(rows) < 3:
        raise ValueError("no kernel rows (did the forward launch any kernel?)")
    header, body = rows[0], rows[2:]
    name_col = header.index(NAME_COLUMN) if NAME_COLUMN in header else None
    columns = {m: header.index(m) for m in METRICS if m in header}
    if "gpu__time_duration.sum" not in columns:
        raise ValueError("gpu__time_duration.sum missing from ncu output")
    kernels = []
    for row in body:
        name = row[name_col] if name_col is not None and name_col < len(row) else "?"
        values = {m: _number(row[c]) if c < len(row) else None for m, c in columns.items()}
        kernels.append(Kernel(name, values))
    return kernels


def _si(value: float, unit: str) -> str:
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def _short(name: str) -> str:
    """A kernel's name without its template arguments and parameter list, clipped."""
    base = name.split("(")[0]
    depth, out = 0, []
    for ch in base:
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif depth == 0:
            out.append(ch)
    short = "".join(out).strip() or name
    return short if len(short) <= NAME_CHARS else short[: NAME_CHARS - 3] + "..."


def kernel_sol(kernel: Kernel, peak_tflops: float | None, peak_gbs: float | None) -> tuple[bool, float] | None:
    """(memory-bound, fraction of the roof it sits under) for a kernel whose FLOPs, bytes and duration
    are known on a GPU with known peaks; None otherwise. The roof is the memory one when the kernel's
    arithmetic intensity is below the ridge point, else the compute one; the fraction is achieved
    bytes/s (or FLOP/s) over that peak: its fraction of speed of light."""
    seconds = kernel.duration_ns * 1e-9
    flops, moved = kernel.flops(), kernel.dram_bytes()
    if seconds <= 0 or flops is None or moved is None or not peak_tflops or not peak_gbs:
        return None
    ridge = peak_tflops * 1e12 / (peak_gbs * 1e9)  # FLOP per byte where the roofs meet
    intensity = flops / moved if moved else float("inf")
    if intensity < ridge:
        return True, moved / seconds / (peak_gbs * 1e9)
    return False, flops / seconds / (peak_tflops * 1e12)


def sol_fraction(kernels: list[Kernel], peak_tflops: float | None, peak_gbs: float | None) -> float | None:
    """A forward's fraction of speed of light: the duration-weighted mean of each kernel's fraction
    of its roof ([`kernel_sol`]), over the kernels whose roofline is known; None when none is."""
    weighted = [
        (k.duration_ns, known[1])
        for k in kernels
        if (known := kernel_sol(k, peak_tflops, peak_gbs)) is not None
    ]
    total = sum(d for d, _ in weighted)
    return sum(d * f for d, f in weighted) / total if total > 0 else None


def roofline(kernel: Kernel, peak_tflops: float | None, peak_gbs: float | None) -> str:
    """`1.2 TFLOP/s (2% of 67), 2.9 TB/s (87% of 3.35), memory-bound, 87% of SOL`, or the reason a part
    is unknown."""
    seconds = kernel.duration_ns * 1e-9
    flops, moved = kernel.flops(), kernel.dram_bytes()
    if seconds <= 0 or (flops is None and moved is None):
        return "roofline: counters not collected"
    parts = []
    rate = flops / seconds if flops is not None else None
    bandwidth = moved / seconds if moved is not None else None
    if rate is not None:
        peak = f" ({100 * rate / (peak_tflops * 1e12):.0f}% of {peak_tflops:g} T)" if peak_tflops else ""
        parts.append(f"{_si(rate, 'FLOP/s')}{peak}")
    if bandwidth is not None:
        peak = f" ({100 * bandwidth / (peak_gbs * 1e9):.0f}% of {peak_gbs / 1000:g} TB/s)" if peak_gbs else ""
        parts.append(f"{_si(bandwidth, 'B/s')}{peak}")
    bound = kernel_sol(kernel, peak_tflops, peak_gbs)
    if bound is not None and flops is not None and moved is not None and peak_tflops and peak_gbs:
        ridge = peak_tflops * 1e12 / (peak_gbs * 1e9)
        intensity = flops / moved if moved else float("inf")
        memory_bound, sol = bound
        if memory_bound:
            parts.append(f"AI {intensity:.3g} FLOP/B < ridge {ridge:.3g}: memory-bound, {100 * sol:.0f}% of SOL")
        else:
            parts.append(f"AI {intensity:.3g} FLOP/B >= ridge {ridge:.3g}: compute-bound, {100 * sol:.0f}% of SOL")
    elif not (peak_tflops and peak_gbs):
        parts.append("bound unknown (no peak numbers for this GPU)")
    return ", ".join(parts)


def render(
    kernels: list[Kernel], peak_tflops: float | None, peak_gbs: float | None, top: int = TOP_KERNELS
) -> str:
    """The compact Nsight Compute section of the P feedback."""
    total = sum(k.duration_ns for k in kernels)
    lines = [f"Nsight Compute: {len(kernels)} kernel launch(es), {total / 1000:.4g} us of GPU time in one forward."]
    sums: dict[str, float] = {}
    for metric in KERNELBENCH_METRICS:
        values = [k.metrics.get(metric) for k in kernels]
        known = [v for v in values if v is not None]
        if known:
            sums[metric] = sum(known)
    if sums:
        lines.append("  " + ", ".join(f"{m} = {v:.4g}" for m, v in sums.items()) + " (summed over kernels)")
    ranked = sorted(kernels, key=lambda k: k.duration_ns, reverse=True)
    lines.append(f"  Top kernels by time ({min(top, len(ranked))} of {len(ranked)}):")
    for k in ranked[:top]:
        share = 100 * k.duration_ns / total if total > 0 else 0.0
        occupancy = k.metrics.get(OCCUPANCY)
        occ = f", occupancy {occupancy:.0f}%" if occupancy is not None else ""
        tensor = k.metrics.get("smsp__inst_executed_pipe_tensor_op_hmma.sum")
        tc = f", tensor-core inst {tensor:.3g}" if tensor else ""
        lines.append(f"  - {_short(k.name)}: {k.duration_ns / 1000:.4g} us ({share:.0f}%){occ}{tc}")
        lines.append(f"    {roofline(k, peak_tflops, peak_gbs)}")
    return "\n".join(lines)


def section(text: str, peak_tflops: float | None, peak_gbs: float | None) -> str:
    """The rendered section from ncu's CSV, or a one-line reason where it cannot be read."""
    try:
        return render(parse_kernels(text), peak_tflops, peak_gbs)
    except ValueError as exc:
        return unavailable(f"could not read ncu output: {exc}")


def unavailable(reason: str) -> str:
    return f"Nsight Compute: counters unavailable ({reason})."

