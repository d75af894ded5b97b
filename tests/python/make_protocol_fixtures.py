"""Regenerate tests/fixtures/protocol/*.json from a real CPU run of the harness.

    python tests/python/make_protocol_fixtures.py --work /tmp/krefine-fixtures

Every response file is what the harness actually answered (real timings, real feedback); only the
scratch paths are replaced by /abs/krefine so the files do not depend on the machine. Builds two C++
extensions (about a minute).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness_client import (
    HOSTILE,
    PROTOCOL,
    WorkerProcess,
    compile_request,
    evaluate_request,
    prepare_request,
    profile_request,
)

PLACEHOLDER = "/abs/krefine"


def normalise(value: Any, work: str) -> Any:
    if isinstance(value, str):
        return value.replace(work, PLACEHOLDER)
    if isinstance(value, dict):
        return {k: normalise(v, work) for k, v in value.items()}
    if isinstance(value, list):
        return [normalise(v, work) for v in value]
    return value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, required=True)
    args = parser.parse_args()
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    files: dict[str, dict[str, Any]] = {}
    problem = (HOSTILE / "problem_add.py").read_text()
    ok_source = (HOSTILE / "ok_cpp.py").read_text()
    worker = WorkerProcess("compile", work / "scratch", work / "worker.log")
    try:
        files["ready.json"] = worker.ready
        request = compile_request(
            1, ok_source, work / "build" / "ok", work / "logs" / "ok.log", arch_list="9.0"
        )
        files["compile_request.json"] = request
        files["compile_response_ok.json"] = worker.request(request)
        error = compile_request(
            2, (HOSTILE / "compile_error.py").read_text(), work / "build" / "err", work / "logs" / "err.log"
        )
        files["compile_response_error.json"] = worker.request(error)
        # Six steps without timing the reference: the evaluate below times it, announced by a
        # `progress` notice.
        prepare = prepare_request(9, problem, steps=6, quiet=False)
        prepare["problem"]["key"] = "hostile/problem_add"
        files["prepare_request.json"] = prepare
        files["prepare_response.json"] = worker.request(prepare)
        request = evaluate_request(3, problem, ok_source, work / "build" / "ok")
        request["problem"]["key"] = "hostile/problem_add"
        files["evaluate_request.json"] = request
        files["evaluate_response_correct.json"] = worker.request(request)
        files["progress_reference_start.json"] = worker.progress[0]
        baseline = dict(request, id=4)
        baseline["reference_runtime"] = {
            "mean": 0.0026, "median": 0.0026, "std": 0.0, "min": 0.0025, "max": 0.0031, "num_trials": 100,
            "source": "baseline:hostile/problem_add.json",
        }  # fmt: skip
        baseline["cast_integer_inputs"] = True
        files["evaluate_request_baseline.json"] = baseline
        mismatch = evaluate_request(
            5, problem, (HOSTILE / "value_mismatch.py").read_text(), work / "build" / "vm"
        )
        files["evaluate_response_incorrect.json"] = worker.request(mismatch)
        request = profile_request(6, problem, ok_source, work / "build" / "ok")
        files["profile_request.json"] = request
        files["profile_response.json"] = worker.request(request)
        worker.send({"id": 7, "op": "evaluate"})
        files["error_response.json"] = worker.read()
        # The shared headers of torch's default flags, made before a run's first candidates ask, in a
        # cache of their own (the builds above started `build/pch`'s in the background).
        warm = {"id": 10, "op": "warm_headers", "build_dir": str(work / "warm" / "build"), "wait_s": 600.0}
        files["warm_headers_request.json"] = warm
        files["warm_headers_response.json"] = worker.request(warm)
        files["shutdown_request.json"] = {"id": 8, "op": "shutdown"}
        files["shutdown_response.json"] = worker.request(files["shutdown_request.json"])
    finally:
        worker.close()
    PROTOCOL.mkdir(parents=True, exist_ok=True)
    for name, message in files.items():
        (PROTOCOL / name).write_text(json.dumps(normalise(message, str(work)), indent=2) + "\n")
        print(f"wrote {PROTOCOL / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
