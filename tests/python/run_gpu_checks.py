"""Checks that need a CUDA device, run by hand on a GPU box (CI has none):

    python tests/python/run_gpu_checks.py --work /tmp/krefine-gpu --arch-list 9.0 --out results.json

Drives a real `serve --role gpu` worker through the hostile candidates on cuda:0, RNG fidelity against
KernelBench's order with CUDA dropout, fp16/bf16, profiling with ncu, and last a kernel that poisons the
CUDA context (sticky error). Prints one line per check; exits 1 if any check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness_client import (
    FIXTURES,
    HOSTILE,
    WorkerProcess,
    compile_request,
    evaluate_request,
    profile_request,
)
from test_eval import CORRECT, DROPOUT, DROPOUT_CANDIDATE, kernelbench_order_diffs

DEVICE = "cuda:0"


class Checks:
    def __init__(self) -> None:
        self.failed: list[str] = []
        self.records: dict[str, Any] = {}

    def expect(self, name: str, condition: bool, detail: Any) -> None:
        print(f"{'ok  ' if condition else 'FAIL'} {name}: {detail}", flush=True)
        if not condition:
            self.failed.append(name)


def hostile(name: str) -> str:
    return (HOSTILE / name).read_text()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--arch-list", default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    work: Path = args.work
    work.mkdir(parents=True, exist_ok=True)
    # Strict mode's native timing loop (kb_native) is built by the GPU worker under --work, not in the tree.
    os.environ.setdefault("KREFINE_NATIVE_DIR", str(work / "native-timer"))
    checks = Checks()
    problem = hostile("problem_add.py")

    compiler = WorkerProcess("compile", work / "scratch_compile", work / "compile_worker.log")
    bad_build = work / "build" / "illegal"
    built = compiler.request(
        compile_request(
            1, hostile("cuda_illegal_address.py"), bad_build, work / "illegal.log", args.arch_list
        )
    )
    compiler.close()
    checks.expect(
        "compile cuda_illegal_address", built["status"] == "ok", (built["status"], built["duration_s"])
    )

    gpu = WorkerProcess("gpu", work / "scratch_gpu", work / "gpu_worker.log")
    checks.records["ready"] = gpu.ready
    checks.expect("ready has the device", gpu.ready["device"] is not None, gpu.ready["device"])
    rid = [100]

    def evaluate(source: str, label: str, **options: Any) -> dict[str, Any]:
        rid[0] += 1
        options.setdefault("problem_code", problem)
        code = options.pop("problem_code")
        r = gpu.request(
            evaluate_request(rid[0], code, source, work / "build" / label, device=DEVICE, **options)
        )
        checks.records[label] = r
        return r

    r = evaluate(CORRECT, "correct")
    checks.expect(
        "correct torch.add candidate",
        r["status"] == "correct"
        and r["env"]["timing_method"] == "cuda_event"
        and r["ref_runtime_source"] == "measured",
        (r["status"], r["runtime"], r["ref_runtime"], r["speedup"], r["phases"]),
    )
    r = evaluate(CORRECT, "correct_again")
    checks.expect("reference timing cached", r["ref_runtime_source"] == "cached", r["ref_runtime_source"])
    r = evaluate(hostile("value_mismatch.py"), "value_mismatch")
    checks.expect(
        "value mismatch metadata",
        r["metadata"].get("max_difference") == ["1.000000"] * 5
        and r["metadata"].get("avg_difference") == ["0.000244"] * 5,
        {k: r["metadata"].get(k) for k in ("max_difference", "avg_difference", "correctness_trials")},
    )
    r = evaluate(hostile("shape_mismatch.py"), "shape_mismatch")
    checks.expect("shape mismatch", r["status"] == "incorrect", r["metadata"].get("correctness_issue"))
    r = evaluate(hostile("print_flood.py"), "print_flood")
    checks.expect("print flood is correct, stream clean", r["status"] == "correct", r["status"])
    r = evaluate(hostile("inplace_input.py"), "inplace_faithful")
    checks.expect("in-place faithful passes", r["status"] == "correct", r["feedback"][:160])
    r = evaluate(hostile("inplace_input.py"), "inplace_strict", mode="strict")
    checks.expect("in-place strict fails", r["status"] == "incorrect", r["metadata"].get("correctness_issue"))
    # Strict timing's native loop on the device (kb_native: CUDA driver events, device-wide fence).
    r = evaluate(CORRECT, "correct_strict", mode="strict")
    checks.expect(
        "strict correct, timed in the native loop",
        r["status"] == "correct" and r["runtime"] > 0 and r["speedup"] is not None and r["findings"] == [],
        (r["status"], r["runtime"], r["speedup"], r["findings"]),
    )
    matmul = (FIXTURES / "integrity" / "problem_matmul.py").read_text()
    hunter = (FIXTURES / "strict" / "loop_state_hunter.py").read_text()
    r = evaluate(hunter, "hunter_strict", mode="strict", problem_code=matmul)
    checks.expect(
        "strict loop-state hunter finds nothing and is timed",
        r["status"] == "correct" and r["runtime"] > 0 and "error_during_performance" not in r["metadata"],
        (r["status"], r["runtime"], r["metadata"].get("error_during_performance"), r["findings"]),
    )
    r = evaluate(CORRECT, "after_inplace", measure=False)
    checks.expect("inputs pristine after in-place", r["status"] == "correct", r["status"])
    r = evaluate(hostile("reuse_freed.py"), "reuse_freed_faithful", measure=False)
    checks.expect("reuse_freed faithful", r["status"] == "incorrect", r["feedback"][:300])
    r = evaluate(hostile("reuse_freed.py"), "reuse_freed_strict", mode="strict", measure=False)
    nan_poisoned = r["metadata"].get("max_difference") == ["nan"] * 5
    checks.expect(
        "reuse_freed strict sees NaN poison",
        r["status"] == "incorrect" and nan_poisoned,
        r["metadata"].get("max_difference"),
    )
    for precision in ("fp16", "bf16"):
        r = evaluate(CORRECT, f"correct_{precision}", precision=precision)
        checks.expect(f"{precision} correct", r["status"] == "correct", (r["status"], r["runtime"]))
    r = evaluate(hostile("huge_alloc.py"), "huge_alloc", measure=False)
    checks.expect(
        "huge alloc (2**62 bytes) is out_of_memory, not sticky, not retried",
        r["status"] == "out_of_memory"
        and not r["sticky"]
        and "retried_without_device_cache" not in r["metadata"],
        r["feedback"][:200],
    )
    r = evaluate(CORRECT, "after_oom", measure=False)
    checks.expect("worker usable after OOM", r["status"] == "correct", r["status"])

    expected = kernelbench_order_diffs(DROPOUT, DROPOUT_CANDIDATE, DEVICE)
    first = evaluate(DROPOUT_CANDIDATE, "dropout_1", problem_code=DROPOUT, measure=False)
    second = evaluate(DROPOUT_CANDIDATE, "dropout_2", problem_code=DROPOUT, measure=False)
    checks.expect(
        "CUDA dropout matches KernelBench order (fresh and cached)",
        first["metadata"].get("max_difference") == expected and second["metadata"] == first["metadata"],
        (expected, first["metadata"].get("max_difference"), second["metadata"].get("max_difference")),
    )

    rid[0] += 1
    prof = gpu.request(
        profile_request(rid[0], problem, CORRECT, work / "build" / "correct", device=DEVICE, ncu=True)
    )
    checks.records["profile"] = prof
    checks.expect(
        "profile table has CUDA time", prof["status"] == "ok" and "CUDA" in prof["table"], prof["table"][:400]
    )
    checks.expect("ncu metrics", prof["ncu"] is not None, (prof["ncu"], prof["note"]))

    r = evaluate(hostile("cuda_illegal_address.py"), "illegal", measure=False)
    checks.records["illegal"] = r
    r_ok = (r["status"], r["sticky"], r["compiled"]) == ("cuda_error", True, False)
    checks.expect(
        "illegal address is sticky cuda_error",
        r_ok and str(r["metadata"].get("cuda_error", "")).startswith("CUDA Error: "),
        (r["status"], r["sticky"], r["compiled"], r["metadata"]),
    )
    print(r["feedback"])
    gpu.kill()
    if args.out:
        args.out.write_text(json.dumps(checks.records, indent=1))
    print("FAILED: " + ", ".join(checks.failed) if checks.failed else "all GPU checks passed")
    return 1 if checks.failed else 0


if __name__ == "__main__":
    sys.exit(main())
