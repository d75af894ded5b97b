"""`krefine baseline --mode compile` against KernelBench's published torch.compile (inductor) baseline,
problem by problem: both means, their ratio, whether the difference is within noise, and the median
and geometric mean of the ratios, for docs/benchmarks.md (issue 26).

    # time the references under torch.compile, then compare (on the GPU machine):
    python3 bench/gpu/compile_baseline.py --krefine .gpu/krefine --dataset .gpu/problems.jsonl \\
        --levels 1 --problems 1-10 --out runs/baseline-compile.json \\
        --theirs PATH/TO/baseline_time_torch_compile_inductor_default.json [--json table.json]
    # compare a baseline file made earlier (anywhere, CPU included):
    python3 bench/gpu/compile_baseline.py --ours runs/baseline-compile.json --theirs PATH/TO/...json
    # print the krefine command and stop (`--dry-run`); with --ours, compare too.

Both files have KernelBench's layout: `{"level1": {"1_Square_matrix_multiplication_.py": {"mean": ms,
"std": ms, ...}}}`. KernelBench's file (results/timing/H100_Modal/ in its repository) is not part of
this repository: pass its path. Ratio = krefine mean / KernelBench mean (above 1: krefine's compiled
reference is slower). Within noise: |ratio - 1| <= max(3 x the combined relative std, 5 %), as
bench/gpu/baseline_table.py judges the eager baseline.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

NOISE_FLOOR = 0.05


@dataclass
class Row:
    level: str
    problem: str
    ours_ms: float | None
    theirs_ms: float | None
    ratio: float | None
    within_noise: bool | None


@dataclass
class Summary:
    compared: int
    within_noise: int
    median_ratio: float | None
    geomean_ratio: float | None
    min_ratio: float | None
    max_ratio: float | None
    only_ours: list[str]
    only_theirs: list[str]


def _mean(entry: Any) -> float | None:
    if not isinstance(entry, dict):
        return None
    mean = entry.get("mean")
    return float(mean) if isinstance(mean, (int, float)) and mean > 0 else None


def compare(ours: dict[str, Any], theirs: dict[str, Any]) -> list[Row]:
    """One row per problem of `ours` (in its order); a problem KernelBench has no positive mean for
    gets no ratio."""
    rows = []
    for level, problems in ours.items():
        for name, a in problems.items():
            b = theirs.get(level, {}).get(name)
            ours_ms, theirs_ms = _mean(a), _mean(b)
            if ours_ms is None or theirs_ms is None:
                rows.append(Row(level, name, ours_ms, theirs_ms, None, None))
                continue
            ratio = ours_ms / theirs_ms
            rel = math.hypot((a.get("std") or 0) / ours_ms, (b.get("std") or 0) / theirs_ms)
            rows.append(Row(level, name, ours_ms, theirs_ms, ratio, abs(ratio - 1) <= max(3 * rel, NOISE_FLOOR)))
    return rows


def summarize(rows: list[Row], ours: dict[str, Any], theirs: dict[str, Any]) -> Summary:
    ratios = [r.ratio for r in rows if r.ratio is not None]
    only_ours = [f"{r.level}/{r.problem}" for r in rows if r.ratio is None]
    # Problems KernelBench has in the levels krefine timed, that krefine did not time.
    only_theirs = [
        f"{level}/{name}"
        for level in ours
        for name in theirs.get(level, {})
        if name not in ours[level]
    ]
    return Summary(
        compared=len(ratios),
        within_noise=sum(1 for r in rows if r.within_noise),
        median_ratio=statistics.median(ratios) if ratios else None,
        geomean_ratio=math.exp(sum(math.log(x) for x in ratios) / len(ratios)) if ratios else None,
        min_ratio=min(ratios) if ratios else None,
        max_ratio=max(ratios) if ratios else None,
        only_ours=only_ours,
        only_theirs=only_theirs,
    )


def _num(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def render(rows: list[Row], summary: Summary) -> str:
    lines = [
        "| problem | krefine compile ms | KernelBench inductor ms | ratio | within noise |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        noise = "-" if r.within_noise is None else ("yes" if r.within_noise else "no")
        lines.append(
            f"| {r.level}/{r.problem} | {_num(r.ours_ms, '.4g')} | {_num(r.theirs_ms, '.4g')} "
            f"| {_num(r.ratio, '.3f')} | {noise} |"
        )
    s = summary
    lines.append("")
    lines.append(
        f"{s.compared} compared: ratio median {_num(s.median_ratio, '.3f')}, geomean "
        f"{_num(s.geomean_ratio, '.3f')}, min {_num(s.min_ratio, '.3f')}, max {_num(s.max_ratio, '.3f')}; "
        f"{s.within_noise} of {s.compared} within noise"
    )
    if s.only_ours:
        lines.append(f"no KernelBench mean for: {', '.join(s.only_ours)}")
    return "\n".join(lines) + "\n"


def baseline_command(args: argparse.Namespace) -> list[str]:
    return [
        args.krefine, "baseline", "--dataset", args.dataset, "--levels", args.levels,
        "--problems", args.problems, "--mode", "compile", "--compile-mode", args.compile_mode,
        "--out", args.out,
    ]


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--theirs", required=True, help="KernelBench's baseline_time_torch_compile_inductor_*.json")
    p.add_argument("--ours", help="a krefine baseline file made earlier (skips running krefine)")
    p.add_argument("--krefine", help="the krefine binary: run `krefine baseline --mode compile` first")
    p.add_argument("--dataset", help="the problems (with --krefine)")
    p.add_argument("--levels", default="1", help="levels to time (with --krefine), e.g. 1,2")
    p.add_argument("--problems", default="all", help="problem selection (with --krefine), e.g. 1-10,40")
    p.add_argument("--compile-mode", default="default", help="torch.compile mode (KernelBench's file: default)")
    p.add_argument("--out", default="runs/baseline-compile.json", help="where krefine writes its baseline")
    p.add_argument("--json", help="also write the rows and the summary here")
    p.add_argument("--dry-run", action="store_true", help="print the krefine command and stop (compare --ours if given)")
    args = p.parse_args(argv)
    if args.ours is None and args.krefine is None:
        p.error("give --ours (a baseline file) or --krefine and --dataset (to make one)")
    if args.krefine is not None and args.dataset is None:
        p.error("--krefine needs --dataset")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    ours_path = args.ours
    if args.krefine is not None:
        command = baseline_command(args)
        print("$ " + " ".join(command), flush=True)
        if not args.dry_run:
            done = subprocess.run(command, check=False)
            if done.returncode != 0:
                print(f"krefine baseline exited with status {done.returncode}", file=sys.stderr)
                return done.returncode
            ours_path = args.out
    if ours_path is None:
        return 0
    theirs_path = Path(args.theirs)
    if not theirs_path.is_file():
        print(f"{theirs_path}: no such file (KernelBench's results/timing/H100_Modal/...json)", file=sys.stderr)
        return 2
    ours = json.loads(Path(ours_path).read_text())
    theirs = json.loads(theirs_path.read_text())
    rows = compare(ours, theirs)
    summary = summarize(rows, ours, theirs)
    sys.stdout.write(render(rows, summary))
    if args.json:
        Path(args.json).write_text(
            json.dumps({"rows": [asdict(r) for r in rows], "summary": asdict(summary)}, indent=2) + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
