"""KernelBench's evaluation of one compiled candidate, written out plainly: the yardstick of
`krefine bench reference` ("no later than KernelBench's own evaluation would end").

The order of operations of `eval_kernel_against_ref` as KernelBench's evaluation
does it (its eval.py at 423217d), in one fresh process and with nothing cached: the reference model,
the candidate (its build already made, as after KernelBench's CPU pre-compile), five correctness trials
whose inputs are made per trial (all of them unless a trial raises or a shape differs), then, when
timing is asked for, the candidate timed on seed-42 inputs if it passed, and the reference timed on
fresh seed-42 inputs in every case (KernelBench's excessive-speedup check runs for failed candidates
too). It uses the harness's own seeds, casts and timer, so the two sides do the same work; only the
time is reported.

    python kernelbench_order.py HARNESS_DIR PROBLEM.py CANDIDATE.py BUILD_DIR DEVICE TRIALS \
        TIMING_TRIALS WARMUP
prints one JSON line: {"seconds", "status", "passed", "trials_run", "phases": {...}}. The clock starts
after `import torch` (a fresh KernelBench process pays that too; left out in KernelBench's favour).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any


def main(argv: list[str]) -> int:
    harness, problem_path, candidate_path, build_dir, device_name = argv[:5]
    trials, timing_trials, warmup = (int(x) for x in argv[5:8])
    sys.path.insert(0, harness)
    import torch

    import kb_compile
    import kb_reference as ref
    import kb_timing

    started = time.perf_counter()
    phases: dict[str, float] = {}
    device = ref.normalize_device(device_name)
    dtype = torch.float32
    problem = ref.load_problem(Path(problem_path).read_text(encoding="utf-8"))

    def prepared(values: list[Any]) -> list[Any]:
        return [ref.prepare_value(v, device, dtype) for v in values]

    ref.set_seed(42)
    init = prepared(problem.get_init_inputs())
    with torch.no_grad():
        ref.set_seed(42)
        model = problem.model(*init)
    t = time.perf_counter()
    source = Path(candidate_path).read_text(encoding="utf-8")
    loaded = kb_compile.load_candidate(source, build_dir, os.path.join(build_dir, "kb-order-load.log"))
    if not loaded.ok or loaded.model_new is None:
        print(json.dumps({"seconds": time.perf_counter() - started, "status": "compile_error"}))
        return 0
    with torch.no_grad():
        ref.set_seed(42)
        model_new = loaded.model_new(*init)
    model = model.to(device=device, dtype=dtype)
    model_new = model_new.to(device=device, dtype=dtype)
    phases["load_s"] = time.perf_counter() - t

    t = time.perf_counter()
    passed, run, status = 0, 0, "correct"
    with torch.no_grad():
        for seed in ref.trial_seeds(42, trials):
            run += 1
            ref.set_seed(seed)
            inputs = prepared(problem.get_inputs())
            ref.set_seed(seed)
            ref.set_seed(seed)
            output = model(*inputs)
            ref.synchronize(device)
            try:
                output_new = model_new(*inputs)
                ref.synchronize(device)
            except Exception:  # noqa: BLE001 - KernelBench returns at a trial's exception
                status = "runtime_error"
                break
            if output.shape != output_new.shape:
                status = "incorrect"
                break
            if torch.allclose(output, output_new, atol=1e-4, rtol=1e-4):
                passed += 1
    if status == "correct" and passed < trials:
        status = "incorrect"
    phases["correctness_s"] = time.perf_counter() - t

    if timing_trials > 0:
        timing = {"warmup": warmup, "trials": timing_trials, "discard_first": 1, "l2_flush": True}
        flusher = kb_timing.L2Flusher()
        if status == "correct":
            t = time.perf_counter()
            ref.set_seed(42)
            kb_timing.time_callable(model_new, prepared(problem.get_inputs()), device, timing, flusher)
            phases["timing_s"] = time.perf_counter() - t
        t = time.perf_counter()
        ref.set_seed(42)
        kb_timing.time_callable(model, prepared(problem.get_inputs()), device, timing, flusher)
        phases["ref_timing_s"] = time.perf_counter() - t
    result = {
        "seconds": time.perf_counter() - started,
        "status": status,
        "passed": passed,
        "trials_run": run,
        "phases": phases,
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
