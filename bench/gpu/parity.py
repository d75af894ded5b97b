"""Faithful-mode parity: the same kernels through KernelBench's own evaluation and through `krefine eval`,
on the same GPU, side by side (verdicts and speedups, kernel by kernel).

    python3 bench/gpu/parity.py kb --kb-src KB/src --runs RUNS --dataset PROBLEMS.jsonl --out DIR [-j 16]
    python3 bench/gpu/parity.py compare --kb DIR/kb.jsonl --krefine RUN_DIR [--out TABLE.md]

`kb` runs KernelBench's code (a checkout's `src/`, passed by path: nothing of it is copied here) the way
its `eval_from_generations.py` does: every kernel built first, in parallel processes, into its own build
folder (`build_compile_cache`), then evaluated one after another, each in a fresh Python process
(`eval_kernel_against_ref`: seed 42, 5 correctness trials, 100 timed trials with `cuda_event`, the
reference timed in the same process after the kernel, fp32). Its results go to `kb.jsonl`, one line a
kernel. `compare` reads them next to a krefine run of the same folder (`krefine eval RUNS ...`, faithful
mode, whose `events.jsonl` holds every evaluation) and prints a table: same verdict or not, each side's
speedup, and their ratio, with the summary the docs quote.

KernelBench's `utils` imports LLM client packages (openai, litellm, dotenv, tqdm) that its evaluation
never calls and that a GPU machine without network may lack; such a package, when missing, is replaced
by an empty module of that name before KernelBench is imported (the evaluation's code is untouched).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

NAME = re.compile(r"level_(\d+)_problem_(\d+)_sample_(\d+)_kernel\.py$")


def stub_missing_clients() -> None:
    """Empty stand-ins for the LLM client packages KernelBench's utils imports, where missing."""
    import importlib.util

    def have(name: str) -> bool:
        try:
            return importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            return False

    if not have("dotenv"):
        m = types.ModuleType("dotenv")
        m.load_dotenv = lambda *a, **k: False  # type: ignore[attr-defined]
        sys.modules["dotenv"] = m
    if not have("openai"):
        m = types.ModuleType("openai")
        m.OpenAI = object  # type: ignore[attr-defined]
        sys.modules["openai"] = m
    if not have("litellm"):
        m = types.ModuleType("litellm")
        m.completion = None  # type: ignore[attr-defined]
        sys.modules["litellm"] = m
    if not have("tqdm"):
        m = types.ModuleType("tqdm")
        m.tqdm = lambda it=None, *a, **k: it  # type: ignore[attr-defined]
        sys.modules["tqdm"] = m
    if not have("requests"):
        sys.modules["requests"] = types.ModuleType("requests")
    if not have("pydantic"):
        sys.modules["pydantic"] = _pydantic_stand_in()


def _pydantic_stand_in() -> types.ModuleType:
    """`pydantic.BaseModel` as KernelBench's result classes use it: annotated fields with defaults,
    set by keyword or attribute."""
    import copy

    class BaseModel:
        def __init__(self, **values: Any) -> None:
            for cls in reversed(type(self).__mro__):
                for field in getattr(cls, "__annotations__", {}):
                    if hasattr(cls, field):
                        setattr(self, field, copy.deepcopy(getattr(cls, field)))
            for field, value in values.items():
                setattr(self, field, value)

    m = types.ModuleType("pydantic")
    m.BaseModel = BaseModel  # type: ignore[attr-defined]
    return m


def kernels(runs: Path) -> list[tuple[int, int, int, Path]]:
    found = []
    for f in sorted(runs.iterdir()):
        m = NAME.search(f.name)
        if m:
            found.append((int(m[1]), int(m[2]), int(m[3]), f))
    return found


def reference_code(dataset: Path) -> dict[tuple[int, int], str]:
    out = {}
    with dataset.open() as f:
        for line in f:
            d = json.loads(line)
            out[(int(d["level"]), int(d["problem_id"]))] = d["code"]
    return out


def import_kernelbench(kb_src: Path) -> Any:
    stub_missing_clients()
    sys.path.insert(0, str(kb_src))
    from kernelbench import eval as kb_eval  # type: ignore[import-not-found]

    return kb_eval


def build_one(kb_src: str, kernel: str, build_dir: str) -> tuple[bool, str]:
    """One kernel built by KernelBench's `build_compile_cache`, in a process of its own."""
    code = (
        "import sys, json\n"
        f"sys.argv = ['x', {kb_src!r}, {kernel!r}, {build_dir!r}]\n"
        "from pathlib import Path\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "import parity\n"
        "kb = parity.import_kernelbench(Path(sys.argv[1]))\n"
        "ok, out, err = kb.build_compile_cache(Path(sys.argv[2]).read_text(), False, sys.argv[3])\n"
        "print(json.dumps({'ok': ok, 'error': err}))\n"
    )
    p = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=900)
    lines = [line for line in p.stdout.splitlines() if line.startswith("{")]
    if not lines:
        return False, p.stderr[-500:]
    r = json.loads(lines[-1])
    return bool(r["ok"]), str(r.get("error") or "")


def eval_one(args: argparse.Namespace) -> None:
    """`eval-one`: KernelBench's evaluation of one kernel in this (fresh) process."""
    kb = import_kernelbench(Path(args.kb_src))
    import torch

    ref = Path(args.ref).read_text()
    custom = Path(args.kernel).read_text()
    started = time.perf_counter()
    r = kb.eval_kernel_against_ref(
        ref,
        custom,
        seed_num=42,
        num_correct_trials=5,
        num_perf_trials=100,
        measure_performance=True,
        timing_method="cuda_event",
        build_dir=args.build_dir,
        device=0,
        backend="cuda",
        precision=torch.float32,
    )
    out: dict[str, Any] = {"wall_s": time.perf_counter() - started}
    if r is None:
        out.update(compiled=False, correctness=False, runtime=-1.0, ref_runtime=-1.0, metadata={})
    else:
        out.update(
            compiled=bool(r.compiled),
            correctness=bool(r.correctness),
            runtime=float(r.runtime),
            ref_runtime=float(getattr(r, "ref_runtime", -1.0)),
            metadata={k: str(v)[:300] for k, v in (r.metadata or {}).items()},
        )
    print("RESULT " + json.dumps(out), flush=True)


def run_kb(args: argparse.Namespace) -> None:
    runs, out = Path(args.runs), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    refs = reference_code(Path(args.dataset))
    todo = kernels(runs)
    if args.limit:
        todo = todo[: args.limit]
    builds = Path(tempfile.mkdtemp(prefix="kb-parity-builds-"))
    ref_dir = Path(tempfile.mkdtemp(prefix="kb-parity-refs-"))
    env_arch = os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
    started = time.perf_counter()
    built: dict[Path, tuple[bool, str]] = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futs = {pool.submit(build_one, str(args.kb_src), str(f), str(builds / f.stem)): f for (_, _, _, f) in todo}
        for fut in concurrent.futures.as_completed(futs):
            built[futs[fut]] = fut.result()
    build_s = time.perf_counter() - started
    print(
        f"built {sum(ok for ok, _ in built.values())} of {len(built)} in {build_s:.1f} s "
        f"(TORCH_CUDA_ARCH_LIST={env_arch})",
        flush=True,
    )
    with (out / "kb.jsonl").open("w") as results:
        for level, pid, sample, f in todo:
            ref = ref_dir / f"{level}_{pid}.py"
            ref.write_text(refs[(level, pid)])
            row: dict[str, Any] = {"level": level, "problem_id": pid, "sample": sample, "file": f.name}
            cmd = [
                sys.executable,
                __file__,
                "eval-one",
                "--kb-src",
                str(args.kb_src),
                "--ref",
                str(ref),
                "--kernel",
                str(f),
                "--build-dir",
                str(builds / f.stem),
            ]
            try:
                p = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=args.timeout)
                lines = [line for line in p.stdout.splitlines() if line.startswith("RESULT ")]
                if lines:
                    row.update(json.loads(lines[-1][len("RESULT ") :]))
                else:
                    row.update(
                        compiled=built.get(f, (False, ""))[0],
                        correctness=False,
                        runtime=-1.0,
                        ref_runtime=-1.0,
                        error=(p.stderr or p.stdout)[-400:],
                    )
            except subprocess.TimeoutExpired:
                row.update(
                    compiled=True,
                    correctness=False,
                    runtime=-1.0,
                    ref_runtime=-1.0,
                    error=f"timeout after {args.timeout} s",
                )
            results.write(json.dumps(row) + "\n")
            results.flush()
            print(f"{f.name}: {verdict_kb(row)} {speedup_kb(row)}", flush=True)
    print(f"KernelBench evaluation of {len(todo)} kernels: {time.perf_counter() - started:.1f} s", flush=True)


def verdict_kb(row: dict[str, Any]) -> str:
    if not row.get("compiled"):
        return "compile_error"
    return "correct" if row.get("correctness") else "incorrect"


def speedup_kb(row: dict[str, Any]) -> float | None:
    rt, ref = float(row.get("runtime", -1)), float(row.get("ref_runtime", -1))
    return ref / rt if rt > 0 and ref > 0 else None


def krefine_results(run: Path) -> dict[tuple[int, int, int], dict[str, Any]]:
    """The last evaluation of each task in a krefine run's event log."""
    out: dict[tuple[int, int, int], dict[str, Any]] = {}
    with (run / "events.jsonl").open() as f:
        for line in f:
            rec = json.loads(line)
            ev = rec.get("event", {})
            if ev.get("type") != "executed":
                continue
            level, pid, sample = (int(x) for x in rec["task"].split("/"))
            out[(level, pid, sample)] = ev["outcome"]
    return out


def verdict_krefine(o: dict[str, Any] | None) -> str:
    if o is None:
        return "not evaluated"
    v = str(o.get("verdict"))
    return {"compile_error": "compile_error", "correct": "correct"}.get(v, "incorrect")


def compare(args: argparse.Namespace) -> None:
    kb_rows = [json.loads(line) for line in Path(args.kb).read_text().splitlines() if line.strip()]
    kr = krefine_results(Path(args.krefine))
    lines = [
        "| kernel | KernelBench | krefine | same verdict | speedup KernelBench | speedup krefine | ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    same = 0
    ratios: list[float] = []
    for row in kb_rows:
        key = (row["level"], row["problem_id"], row["sample"])
        o = kr.get(key)
        a, b = verdict_kb(row), verdict_krefine(o)
        same += a == b
        s_kb = speedup_kb(row) if a == "correct" else None
        s_kr = o.get("speedup") if o and b == "correct" else None
        ratio = s_kr / s_kb if s_kb and s_kr else None
        if ratio:
            ratios.append(ratio)
        fmt = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
        lines.append(
            f"| {row['file']} | {a} | {b} | {'yes' if a == b else '**no**'} | {fmt(s_kb)} | "
            f"{fmt(s_kr)} | {fmt(ratio)} |"
        )
    summary = f"same verdict: {same} of {len(kb_rows)}"
    if ratios:
        within = sum(abs(r - 1) <= 0.03 for r in ratios)
        summary += (
            f"; speedup ratio krefine / KernelBench over {len(ratios)} correct: median "
            f"{statistics.median(ratios):.3f}, range {min(ratios):.3f}-{max(ratios):.3f}, "
            f"{within} within 3 %"
        )
    text = "\n".join(lines) + "\n\n" + summary + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    k = sub.add_parser("kb")
    k.add_argument("--kb-src", type=Path, required=True)
    k.add_argument("--runs", type=Path, required=True)
    k.add_argument("--dataset", type=Path, required=True)
    k.add_argument("--out", type=Path, required=True)
    k.add_argument("-j", "--jobs", type=int, default=16)
    k.add_argument("--limit", type=int, default=0)
    k.add_argument("--timeout", type=int, default=600)
    one = sub.add_parser("eval-one")
    one.add_argument("--kb-src", required=True)
    one.add_argument("--ref", required=True)
    one.add_argument("--kernel", required=True)
    one.add_argument("--build-dir", required=True)
    c = sub.add_parser("compare")
    c.add_argument("--kb", type=Path, required=True)
    c.add_argument("--krefine", type=Path, required=True)
    c.add_argument("--out", type=Path)
    args = ap.parse_args()
    {"kb": run_kb, "eval-one": eval_one, "compare": compare}[args.cmd](args)


if __name__ == "__main__":
    main()
