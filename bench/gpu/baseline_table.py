"""A Markdown table comparing a `krefine baseline` file with KernelBench's published baseline, for
docs/benchmarks.md. Rows: problems in both files; columns: both means (ms), the ratio, and whether the
difference is within noise (|ratio - 1| <= 3 x the combined relative std, or <= 5 %).

    python3 bench/gpu/baseline_table.py runs/baseline-l1.json .gpu/baseline_h100_modal.json
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path


def main(ours_path: str, theirs_path: str) -> None:
    ours = json.loads(Path(ours_path).read_text())
    theirs = json.loads(Path(theirs_path).read_text())
    print(f"| problem | krefine ms | KernelBench ms | ratio | within noise |")
    print("|---|---|---|---|---|")
    agree = total = 0
    for level, problems in ours.items():
        for name, a in problems.items():
            b = theirs.get(level, {}).get(name)
            if not a or not b or not b.get("mean"):
                print(f"| {level}/{name} | {a and a['mean']} | {b and b.get('mean')} | - | - |")
                continue
            ratio = a["mean"] / b["mean"]
            rel = math.hypot((a.get("std") or 0) / a["mean"], (b.get("std") or 0) / b["mean"])
            ok = abs(ratio - 1) <= max(3 * rel, 0.05)
            agree += ok
            total += 1
            print(f"| {level}/{name} | {a['mean']:.4g} | {b['mean']:.4g} | {ratio:.3f} | {'yes' if ok else 'no'} |")
    print(f"\n{agree} of {total} within noise")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
