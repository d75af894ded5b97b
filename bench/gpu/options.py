"""The GPU checks of KernelBench's evaluation options (timing methods, tolerance presets, compiled
reference, Nsight Compute feedback), run by hand on one GPU from the repository root:

    PATH=/usr/local/cuda/bin:$PATH python3 bench/gpu/options.py [--kernelbench-timing timing.py] [--out DIR]

With `--kernelbench-timing` (KernelBench's src/kernelbench/timing.py carried to the machine, loaded as a
lone module: the package's __init__ patches torch.randn), each timing method's median is compared with
KernelBench's `get_timing_function` on the same callables (the issue's bar: within 3 %), and the
compiled reference with KernelBench's cuda_event timer on `torch.compile(Model())` (what its
`measure_ref_program_time(use_torch_compile=True)` does). Prints one
line per check and a summary; writes summary.json to --out. Exits 1 if a check fails.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "python"))
sys.path.insert(0, str(REPO / "src" / "harness"))

import torch  # noqa: E402

import kb_eval  # noqa: E402
import kb_profile  # noqa: E402
import kb_timing  # noqa: E402
from harness_client import evaluate_request  # noqa: E402 - puts the harness on sys.path too

DEVICE = torch.device("cuda:0")
METHODS = ("cuda_event", "do_bench", "do_bench_impl", "host_time")
# H100 SXM peaks as prompt::gpu_specs has them (fp32 with TF32 off; HBM3).
PEAKS = {"max_speedup": None, "peak_tflops": 67.0, "peak_bandwidth_gbs": 3350.0}
PROBLEM = textwrap.dedent(
    """
    import torch
    import torch.nn as nn

    class Model(nn.Module):
        def __init__(self):
            super().__init__()

        def forward(self, a, b):
            return torch.relu(torch.matmul(a, b))

    def get_inputs():
        return [torch.rand(2048, 2048), torch.rand(2048, 2048)]

    def get_init_inputs():
        return []
    """
)
TRITON_RELU_MATMUL = textwrap.dedent(
    """
    import torch
    import torch.nn as nn
    import triton
    import triton.language as tl

    @triton.jit
    def relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        x = tl.load(x_ptr + offsets, mask=mask)
        tl.store(y_ptr + offsets, tl.maximum(x, 0.0), mask=mask)

    class ModelNew(nn.Module):
        def __init__(self):
            super().__init__()

        def forward(self, a, b):
            x = torch.matmul(a, b)
            y = torch.empty_like(x)
            n = x.numel()
            relu_kernel[(triton.cdiv(n, 1024),)](x, y, n, BLOCK=1024)
            return y
    """
)
# Runs, but wrong (a profile must still render).
WRONG = TRITON_RELU_MATMUL.replace("tl.maximum(x, 0.0)", "tl.maximum(x, 1.0)")
# Off by a relative 1e-3: incorrect under kernelbench (fp32: atol = rtol = 1e-4), correct under
# kernelbench-v0 (1e-2). (An absolute 1e-3 is within rtol x |output| for these outputs, ~500.)
BORDERLINE = "import torch\nimport torch.nn as nn\n\nclass ModelNew(nn.Module):\n    def forward(self, a, b):\n        return torch.relu(torch.matmul(a, b)) * (1 + 1e-3)\n"
# The reference itself as a candidate (the compiled-reference check must not hang on Triton).
PLAIN = "import torch\nimport torch.nn as nn\n\nclass ModelNew(nn.Module):\n    def forward(self, a, b):\n        return torch.relu(torch.matmul(a, b))\n"


def why(r: dict[str, Any]) -> str:
    """A failed evaluation's own message (its first line), for the check's detail."""
    meta = r.get("metadata", {})
    for key in ("runtime_error", "compilation_error", "error", "correctness_issue"):
        if meta.get(key):
            return f"; {key}: {str(meta[key]).strip().splitlines()[-1][:300]}"
    return ""


class Checks:
    def __init__(self) -> None:
        self.failed: list[str] = []
        self.records: dict[str, Any] = {}

    def expect(self, name: str, ok: bool, detail: Any) -> None:
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}", flush=True)
        self.records[name] = {"ok": ok, "detail": detail}
        if not ok:
            self.failed.append(name)


def workloads() -> dict[str, tuple[Any, list[torch.Tensor]]]:
    torch.manual_seed(0)
    big = torch.rand(4096, 4096, device=DEVICE)
    vec = torch.rand(1 << 26, device=DEVICE)
    return {
        "matmul-4096": (torch.matmul, [big, big]),
        "relu-64M": (torch.relu, [vec]),
        "softmax-4096": (lambda x: torch.softmax(x, dim=-1), [big]),
    }


def check_timing(checks: Checks, kernelbench: Any) -> None:
    flusher = kb_timing.L2Flusher()
    for name, (fn, args) in workloads().items():
        for method in METHODS:
            timing = {"warmup": 3, "trials": 100, "discard_first": 1, "l2_flush": True, "method": method}
            ours = statistics.median(kb_timing.time_by_method(fn, args, DEVICE, timing, flusher))
            if kernelbench is None:
                checks.expect(f"timing {method} {name}", ours > 0, f"krefine median {ours:.4f} ms")
                continue
            timer = kernelbench.get_timing_function(method)
            theirs = statistics.median(
                timer(fn, args, num_warmup=3, num_trials=100, discard_first=1, verbose=False, device=DEVICE)
            )
            off = abs(ours / theirs - 1)
            checks.expect(
                f"timing {method} {name}",
                off <= 0.03,
                f"krefine {ours:.4f} ms, KernelBench {theirs:.4f} ms ({100 * off:.1f}% apart)",
            )


def evaluate(worker: kb_eval.Worker, root: Path, n: int, source: str, **options: Any) -> dict[str, Any]:
    request = evaluate_request(n, PROBLEM, source, root / f"c{n}", device="cuda:0", **options)
    return kb_eval.evaluate(request, worker)


def check_recorded(checks: Checks, worker: kb_eval.Worker, root: Path) -> None:
    for i, method in enumerate(METHODS):
        r = evaluate(worker, root, 10 + i, TRITON_RELU_MATMUL, timing_method=method)
        checks.expect(
            f"evaluate triton candidate, {method}",
            r["status"] == "correct" and r["env"]["timing_method"] == method,
            f"{r['status']}, env {r['env']['timing_method']}, runtime {r['runtime']:.4f} ms, "
            f"speedup {r.get('speedup')}{'' if r['status'] == 'correct' else why(r)}",
        )
    kb = {"name": "kernelbench", "atol": 1e-4, "rtol": 1e-4}
    v0 = {"name": "kernelbench-v0", "atol": 1e-2, "rtol": 1e-2}
    a = evaluate(worker, root, 20, BORDERLINE, tolerance=kb, measure=False)
    b = evaluate(worker, root, 21, BORDERLINE, tolerance=v0, measure=False)
    checks.expect(
        "borderline under kernelbench / kernelbench-v0",
        (a["correctness"], b["correctness"]) == (False, True),
        f"{a['correctness']} / {b['correctness']}",
    )


def check_compiled_reference(checks: Checks, worker: kb_eval.Worker, root: Path, kb_timing_mod: Any) -> None:
    eager = evaluate(worker, root, 30, PLAIN)
    spec = {"backend": "inductor", "mode": "default"}
    compiled = evaluate(worker, root, 31, PLAIN, reference_compile=spec)
    detail = (
        f"reference eager {eager['ref_runtime']:.4f} ms, compiled {compiled['ref_runtime']:.4f} ms, "
        f"env {compiled['env'].get('reference_mode')}"
    )
    ok = compiled["env"].get("reference_mode") == "compile (inductor, default)" and compiled["ref_runtime"] > 0
    if kb_timing_mod is not None:
        scope: dict[str, Any] = {}
        exec(compile(PROBLEM, "problem", "exec"), scope)  # noqa: S102 - our own problem text
        inputs = [x.to(DEVICE) for x in scope["get_inputs"]()]
        torch._dynamo.reset()
        model = torch.compile(scope["Model"]().to(DEVICE), backend="inductor", mode="default")
        with torch.no_grad():
            times = kb_timing_mod.time_execution_with_cuda_event(
                model, inputs, num_warmup=3, num_trials=100, discard_first=1, verbose=False, device=DEVICE
            )
        mean = statistics.fmean(times)
        off = abs(compiled["ref_runtime"] / mean - 1)
        detail += f"; KernelBench's timer on the compiled Model: mean {mean:.4f} ms ({100 * off:.1f}% apart)"
        ok = ok and off <= 0.03
    checks.expect("compiled reference", ok, detail)


def check_profile(checks: Checks, worker: kb_eval.Worker, root: Path) -> None:
    for n, (label, source) in enumerate((("correct", TRITON_RELU_MATMUL), ("incorrect", WRONG))):
        request = {
            "id": 40 + n,
            "op": "profile",
            "problem": {"key": "gpu/1", "code": PROBLEM, "code_hash": "-"},
            "candidate": {"source": source, "build_dir": str(root / f"p{n}")},
            "device": "cuda:0",
            "precision": "fp32",
            "row_limit": 8,
            "ncu": True,
            "profiler": "both",
            "peaks": PEAKS,
        }
        r = kb_profile.profile(request, worker.references, str(root))
        section = r["table"][r["table"].find("Nsight Compute") :]
        print(textwrap.indent(section, "    "))
        checks.expect(
            f"profile {label} candidate with ncu",
            r["status"] == "ok" and "sm__cycles_active.avg" in section and "of SOL" in section,
            f"{r['status']}, note {r['note']}, profile {r['duration_s']:.1f} s",
        )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kernelbench-timing", help="KernelBench's src/kernelbench/timing.py")
    parser.add_argument("--out", default="/tmp/krefine-options")
    args = parser.parse_args()
    kernelbench = None
    if args.kernelbench_timing:
        spec = importlib.util.spec_from_file_location("kernelbench_timing", args.kernelbench_timing)
        assert spec is not None and spec.loader is not None
        kernelbench = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(kernelbench)
    checks = Checks()
    out = Path(args.out).resolve()
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        # As krefine's worker does: candidate processes may write only their build folder and the
        # working folder, so Triton's cache goes under the latter (not the home).
        os.chdir(root)
        os.environ["TRITON_CACHE_DIR"] = str(root / "triton-cache")
        worker = kb_eval.Worker(isolate=True)
        check_timing(checks, kernelbench)
        check_recorded(checks, worker, root)
        check_compiled_reference(checks, worker, root, kernelbench)
        check_profile(checks, worker, root)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(checks.records, indent=1))
    print(
        f"\n{len(checks.records) - len(checks.failed)} of {len(checks.records)} checks passed; "
        f"failed: {', '.join(checks.failed) or 'none'}"
    )
    return 1 if checks.failed else 0


if __name__ == "__main__":
    sys.exit(main())
