"""Run every scripted quickstart answer through the real harness (compile, evaluate, profile) and print
the status matrix; exit 1 if it differs from EXPECTED.

    python tests/python/run_quickstart.py --device cpu --work /tmp/krefine-qs
    python tests/python/run_quickstart.py --device cuda:0 --arch-list 9.0 --compile-workers 8 --work /tmp/qs

Used by test_quickstart.py (opt-in: KREFINE_QUICKSTART=1) and by hand on a GPU box.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness_client import (
    WorkerProcess,
    compile_request,
    evaluate_request,
    first_code_block,
    profile_request,
    quickstart_answers,
    quickstart_problem,
)

# (problem, turn) -> status. "no_code" means the answer has no code block (never sent to a worker).
EXPECTED: dict[tuple[str, int], str] = {
    ("1/1", 1): "compile_error",
    ("1/1", 2): "correct",
    ("1/1", 3): "correct",
    ("1/2", 1): "incorrect",
    ("1/2", 2): "correct",
    ("1/2", 3): "no_code",
    ("1/3", 1): "correct",
    ("1/3", 2): "correct",
    ("1/3", 3): "correct",
    ("1/4", 1): "runtime_error",
    ("1/4", 2): "correct",
    ("1/4", 3): "correct",
}


def build_dir_for(work: Path, source: str) -> Path:
    return work / "build" / hashlib.sha256(source.encode()).hexdigest()[:16]


def compile_all(
    sources: list[str], work: Path, workers: int, arch_list: str | None
) -> dict[str, dict[str, Any]]:
    """Compile each distinct source once, on `workers` compile workers in parallel."""
    distinct = list(dict.fromkeys(sources))
    pool = [
        WorkerProcess("compile", work / f"scratch_c{i}", work / f"compile_worker_{i}.log")
        for i in range(min(workers, len(distinct)))
    ]

    def run(index: int) -> tuple[str, dict[str, Any]]:
        source = distinct[index]
        worker = pool[index % len(pool)]
        build = build_dir_for(work, source)
        return source, worker.request(
            compile_request(index + 1, source, build, build / "compile.log", arch_list)
        )

    results: dict[str, dict[str, Any]] = {}
    try:
        # One thread per worker slot: a worker handles one request at a time.
        for offset in range(0, len(distinct), len(pool)):
            batch = range(offset, min(offset + len(pool), len(distinct)))
            with ThreadPoolExecutor(len(pool)) as executor:
                results.update(executor.map(run, batch))
    finally:
        for worker in pool:
            worker.close()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--arch-list", default=None)
    parser.add_argument("--compile-workers", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None, help="write all responses here")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    answers = quickstart_answers()
    sources = [code for a in answers if (code := first_code_block(a["content"])) is not None]
    started = time.perf_counter()
    compiled = compile_all(sources, args.work, args.compile_workers, args.arch_list)
    compile_s = time.perf_counter() - started
    role = "gpu" if args.device.startswith("cuda") else "compile"
    evaluator = WorkerProcess(role, args.work / "scratch_eval", args.work / "eval_worker.log")
    matrix: dict[tuple[str, int], str] = {}
    records: list[dict[str, Any]] = []
    try:
        for rid, answer in enumerate(answers, start=100):
            key = (answer["problem"], answer["turn"])
            source = first_code_block(answer["content"])
            if source is None:
                matrix[key] = "no_code"
                continue
            problem = quickstart_problem(answer["problem"])
            build = build_dir_for(args.work, source)
            result = evaluator.request(evaluate_request(rid, problem, source, build, device=args.device))
            record = {
                "problem": answer["problem"],
                "turn": answer["turn"],
                "compile": compiled[source],
                "evaluate": result,
            }
            if result["status"] == "correct":
                record["profile"] = evaluator.request(
                    profile_request(rid + 1000, problem, source, build, args.device)
                )
            matrix[key] = result["status"]
            records.append(record)
            speed = f"speedup {result['speedup']:.2f}x" if result["speedup"] else ""
            print(f"{answer['problem']} turn {answer['turn']}: {result['status']:14s} {speed}", flush=True)
    finally:
        evaluator.close()
    if args.json:
        args.json.write_text(json.dumps(records, indent=1))
    print(f"compile phase: {compile_s:.1f} s for {len(set(sources))} distinct candidates")
    wrong = {k: (v, EXPECTED.get(k)) for k, v in matrix.items() if EXPECTED.get(k) != v}
    if wrong:
        print(f"UNEXPECTED (got, expected): {wrong}")
        return 1
    print("all statuses as expected")
    return 0


if __name__ == "__main__":
    sys.exit(main())
