"""`op: profile`: the "P" signal. A torch.profiler table of one candidate forward (after a warm-up), and
optionally a few Nsight Compute metrics from a separate `ncu` process.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

import kb_compile
import kb_feedback
import kb_ncu
import kb_sandbox
from kb_candidate import construct_candidate
from kb_correctness import is_out_of_memory, sticky_error
from kb_feedback import CANDIDATE_ERRORS
from kb_reference import ReferenceCache, ReferenceSpec, release_memory, select_device
from kb_tensors import synchronize

TABLE_MAX_CHARS = 4000
NCU_TIMEOUT_S = 300
# ncu metric -> our field. Occupancy and throughputs are duration-weighted over the forward's kernels.
NCU_METRICS: dict[str, str] = {
    "gpu__time_duration.sum": "duration_ns",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "achieved_occupancy",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "dram_throughput_pct",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "sm_throughput_pct",
}
_NCU_TARGET = """\
import sys
sys.path.insert(0, {harness_dir!r})
import kb_profile
kb_profile.ncu_target({job_path!r})
"""


def trim_table(table: str, limit: int = TABLE_MAX_CHARS) -> str:
    """Drop body rows from the bottom until the table fits; header and totals stay."""
    if len(table) <= limit:
        return table
    lines = table.rstrip("\n").splitlines()
    # Layout: dashes, column titles, dashes, rows..., dashes, "Self CPU time total: ...", ...
    rules = [i for i, line in enumerate(lines) if line.startswith("---")]
    if len(rules) < 3:
        return kb_feedback.clip(table, limit)
    head, body, tail = lines[: rules[1] + 1], lines[rules[1] + 1 : rules[2]], lines[rules[2] :]
    while body and len("\n".join(head + body + ["(more rows not shown)"] + tail)) > limit:
        body.pop()
    return "\n".join(head + body + ["(more rows not shown)"] + tail)


def profiler_table(model: torch.nn.Module, inputs: list[Any], device: torch.device, row_limit: int) -> str:
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.no_grad():
        model(*inputs)  # warm-up: lazy JIT compiles, library handles, allocator growth
        synchronize(device)
        # A named range gives the whole forward a row, even when it is one opaque extension call.
        with (
            torch.profiler.profile(activities=activities) as prof,
            torch.profiler.record_function("ModelNew.forward"),
        ):
            model(*inputs)
            synchronize(device)
    sort_by = "device_time_total" if device.type == "cuda" else "cpu_time_total"
    table = prof.key_averages().table(sort_by=sort_by, row_limit=row_limit, max_name_column_width=60)
    return trim_table(table)


def _result(request: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": request["id"],
        "ok": True,
        "kind": "profile",
        "status": "ok",
        "table": "",
        "ncu": None,
        "note": None,
        "duration_s": 0.0,
        "sticky": False,
    }


def profile(request: dict[str, Any], references: ReferenceCache, scratch: str) -> dict[str, Any]:
    """Profile the request's candidate against the reference data in `references` (the worker's cache,
    or a fresh one in a candidate process)."""
    started = time.perf_counter()
    result = _result(request)
    device = select_device(request)
    _profile_into(result, request, references, device, scratch)
    result["duration_s"] = round(time.perf_counter() - started, 6)
    return result


def _profile_into(
    result: dict[str, Any],
    request: dict[str, Any],
    references: ReferenceCache,
    device: torch.device,
    scratch: str,
) -> None:
    ctx = references.context(ReferenceSpec.of(request))
    if ctx.error is not None:
        result["status"], result["note"] = "reference_error", kb_feedback.exception_line(ctx.error.exc)
        return
    candidate = request["candidate"]
    loaded = kb_compile.load_candidate(
        candidate["source"], candidate["build_dir"], os.path.join(candidate["build_dir"], "load.log")
    )
    try:
        if not loaded.ok:
            result["status"], result["note"] = "compile_error", loaded.feedback
            return
        assert loaded.model_new is not None
        try:
            model = construct_candidate(ctx, loaded.model_new)
            result["table"] = profiler_table(model, ctx.timing_inputs(), device, request["row_limit"])
        except CANDIDATE_ERRORS as exc:
            _classify(result, exc, device, loaded.candidate_path)
            return
        profiler = profiler_of(request)
        if profiler == "ncu":
            result["table"] = ""
        if profiler != "torch" and not request.get("ncu_from_worker"):
            add_ncu(result, request, device, scratch)
    finally:
        kb_compile.unload_candidate(loaded)
        if not result["sticky"]:
            release_memory(device)


def _classify(result: dict[str, Any], exc: BaseException, device: torch.device, candidate_path: str) -> None:
    poisoned = sticky_error(exc, device)
    if poisoned is not None:
        result["status"], result["sticky"] = "cuda_error", True
    elif is_out_of_memory(exc):
        result["status"] = "out_of_memory"
    else:
        result["status"] = "runtime_error"
    result["note"] = kb_feedback.candidate_traceback(exc, candidate_path)


# ------------------------------------------------------------------------------------------------- ncu


def profiler_of(request: dict[str, Any]) -> str:
    """`eval.profiler`: `torch`, `ncu` or `both`; absent: `both` where `ncu`, else `torch`."""
    return str(request.get("profiler") or ("both" if request["ncu"] else "torch"))


def run_ncu(
    request: dict[str, Any], device: torch.device, scratch: str
) -> tuple[dict[str, Any] | None, str | None]:
    """Profile one candidate forward under ncu in a child process. Any failure: (None, why)."""
    raw, why = run_ncu_raw(request, device, scratch)
    if raw is None:
        return None, why
    try:
        return parse_ncu_csv(raw), None
    except ValueError as exc:
        return None, f"could not read ncu output: {exc}"


def run_ncu_raw(request: dict[str, Any], device: torch.device, scratch: str) -> tuple[str | None, str | None]:
    """ncu's raw CSV page for one candidate forward (metrics: ours and kb_ncu's), or (None, why)."""
    if device.type != "cuda":
        return None, "ncu needs a CUDA device"
    exe = shutil.which("ncu")
    if exe is None:
        return None, "ncu was requested but is not on PATH"
    _, script_path = _write_ncu_job(request, device, scratch)
    metrics = list(dict.fromkeys([*NCU_METRICS, *kb_ncu.METRICS]))
    command = [
        exe,
        "--profile-from-start", "off",
        "--clock-control", "none",
        # Only the forward's process: loading a candidate runs ninja, which must not carry ncu's
        # injection under the confinement (it fails there, and the load with it).
        "--target-processes", "application-only",
        "--metrics", ",".join(metrics),
        "--csv", "--page", "raw", "--print-units", "base",
        sys.executable, script_path,
    ]  # fmt: skip
    try:
        # ncu's lock folder ($TMPDIR/nvidia/nsight_compute) must be writable by the profiled process,
        # which may write only in its own folder once confined.
        env = {**os.environ, "TMPDIR": os.path.dirname(script_path)}
        done = subprocess.run(command, capture_output=True, text=True, timeout=NCU_TIMEOUT_S, check=False, env=env)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"ncu did not finish: {exc}"
    if done.returncode != 0:
        tail = kb_feedback.clip((done.stdout + done.stderr).strip()[-1500:], 1500)
        return None, f"ncu exited with status {done.returncode}: {tail}"
    return done.stdout, None


def add_ncu(result: dict[str, Any], request: dict[str, Any], device: torch.device, scratch: str) -> None:
    """Run ncu on the request's candidate and add its section after the torch table (if any)."""
    result["ncu"], result["note"], section = ncu_feedback(request, device, scratch)
    result["table"] = "\n\n".join(part for part in (result["table"], section) if part)


def ncu_feedback(
    request: dict[str, Any], device: torch.device, scratch: str
) -> tuple[dict[str, Any] | None, str | None, str]:
    """(metrics, note, the P feedback's Nsight Compute section). Where counters cannot be read the
    section is a one-line reason and the profile still succeeds. The section ends with what ncu cost
    (its replay passes make it the expensive part of a profile; bounded by NCU_TIMEOUT_S)."""
    started = time.perf_counter()
    raw, why = run_ncu_raw(request, device, scratch)
    cost = f"(ncu took {time.perf_counter() - started:.1f} s of at most {NCU_TIMEOUT_S} s)"
    if raw is None:
        reason = why or "no output"
        return None, reason, kb_ncu.unavailable(reason)
    peaks = request.get("peaks") or {}
    section = kb_ncu.section(raw, peaks.get("peak_tflops"), peaks.get("peak_bandwidth_gbs")) + " " + cost
    try:
        metrics = parse_ncu_csv(raw)
        metrics["sol_fraction"] = kb_ncu.sol_fraction(
            kb_ncu.parse_kernels(raw), peaks.get("peak_tflops"), peaks.get("peak_bandwidth_gbs")
        )
        return metrics, None, section
    except ValueError as exc:
        return None, f"could not read ncu output: {exc}", section


def _write_ncu_job(request: dict[str, Any], device: torch.device, scratch: str) -> tuple[str, str]:
    folder = Path(scratch) / f"ncu_{request['id']}"
    folder.mkdir(parents=True, exist_ok=True)
    job = {
        # The request's reference spec (kb_reference.ReferenceSpec reads it in the ncu child).
        "reference": {**request, "device": str(device)},
        "source": request["candidate"]["source"],
        "build_dir": request["candidate"]["build_dir"],
        "device": str(device),
        "log_path": str(folder / "load.log"),
    }
    job_path = folder / "job.json"
    job_path.write_text(json.dumps(job))
    script_path = folder / "ncu_target.py"
    harness_dir = os.path.dirname(os.path.abspath(__file__))
    script_path.write_text(_NCU_TARGET.format(harness_dir=harness_dir, job_path=str(job_path)))
    return str(job_path), str(script_path)


def ncu_target(job_path: str) -> None:
    """Runs inside the ncu child: build like evaluate, warm up, then one forward in a profiler range."""
    os.dup2(2, 1)  # ncu's CSV is the only thing that may reach stdout
    job = json.loads(Path(job_path).read_text())
    device = torch.device(job["device"])
    torch.cuda.set_device(device)
    # The candidate's confinement (kb_sandbox), applied once CUDA is up and before any candidate code
    # is imported: ncu's injection writes under /proc while CUDA initialises, which the confinement
    # refuses (seen on the H200: cudaGetDeviceCount error 304 in every confined variant).
    torch.zeros(1, device=device)
    torch.cuda.synchronize(device)
    folder = os.path.dirname(job_path)
    kb_sandbox.enter_candidate(folder, [job["build_dir"], folder])
    ctx = ReferenceCache().context(ReferenceSpec.of(job["reference"]))
    if ctx.error is not None:
        raise ctx.error.exc
    loaded = kb_compile.load_candidate(job["source"], job["build_dir"], job["log_path"])
    if loaded.model_new is None:
        raise RuntimeError(f"candidate did not load: {loaded.error_name}: {loaded.error}")
    model = construct_candidate(ctx, loaded.model_new)
    inputs = ctx.timing_inputs()
    with torch.no_grad():
        model(*inputs)
        torch.cuda.synchronize(device)
        torch.cuda.profiler.start()
        model(*inputs)
        torch.cuda.synchronize(device)
        torch.cuda.profiler.stop()


def parse_ncu_csv(text: str) -> dict[str, Any]:
    """Sum durations over kernels; weight occupancy and throughputs by duration."""
    rows = list(csv.reader(line for line in text.splitlines() if line.startswith('"')))
    if len(rows) < 3:
        raise ValueError("no kernel rows (did the forward launch any kernel?)")
    header, kernels = rows[0], rows[2:]  # rows[1] holds the units
    columns = {name: header.index(name) for name in NCU_METRICS if name in header}
    duration_col = columns.get("gpu__time_duration.sum")
    if duration_col is None:
        raise ValueError("gpu__time_duration.sum missing from ncu output")
    durations = [_number(row[duration_col]) for row in kernels]
    total = sum(d for d in durations if d is not None)
    metrics: dict[str, Any] = {"duration_ns": total, "num_kernels": len(kernels)}
    for name, field in NCU_METRICS.items():
        if field == "duration_ns":
            continue
        col = columns.get(name)
        pairs = (
            [(d, _number(row[col])) for d, row in zip(durations, kernels, strict=True)]
            if col is not None
            else []
        )
        weighted = [(d, v) for d, v in pairs if d is not None and v is not None]
        weight = sum(d for d, _ in weighted)
        metrics[field] = sum(d * v for d, v in weighted) / weight if weight > 0 else None
    return metrics


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None
