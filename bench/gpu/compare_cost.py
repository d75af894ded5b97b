"""What a failing correctness check costs in a fresh process (issue 36): the first, second and third
comparison of a 64 MB output that mismatches (KernelBench's allclose, max and mean, and krefine's
diagnosis of the mismatch), and one that matches, each in a new process whose CUDA context exists;
`warm` processes first run the same comparisons on 64 elements (what a spare would do to load the
kernels before a candidate is in it). Prints one line per process:

    python3 bench/gpu/compare_cost.py            # cold, then warm, three processes each
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

HARNESS = Path(__file__).resolve().parents[2] / "src" / "harness"


def child(warm: bool, failing: bool) -> dict[str, object]:
    sys.path.insert(0, str(HARNESS))
    import torch

    import kb_correctness

    device = torch.device("cuda:0")
    torch.empty(1, device=device)
    torch.cuda.synchronize(device)
    started = time.perf_counter()
    if warm:
        small = torch.linspace(-1.0, 1.0, 64, device=device)
        for other in (small.clone(), small + 0.5, torch.where(small > 0, torch.nan, small)):
            kb_correctness.compare_trial(small, other, 1e-4, 1e-4, 0)
        torch.cuda.synchronize(device)
    warm_s = time.perf_counter() - started
    expected = torch.rand(4096, 4096, device=device)
    got = expected + (1e-2 if failing else 0.0)
    torch.cuda.synchronize(device)
    spans = []
    for index in range(3):
        started = time.perf_counter()
        compared = kb_correctness.compare_trial(expected, got, 1e-4, 1e-4, index)
        torch.cuda.synchronize(device)
        spans.append(round((time.perf_counter() - started) * 1000, 2))
        assert compared.passed is not failing
    return {"warm": warm, "failing": failing, "warm_up_ms": round(warm_s * 1000, 1), "compare_ms": spans}


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "child":
        warm, failing = sys.argv[2].split(",")
        print(json.dumps(child(warm == "1", failing == "1")))
        return
    for warm in ("0", "1"):
        for failing in ("1", "1", "0"):
            out = subprocess.run(
                [sys.executable, __file__, "child", f"{warm},{failing}"], capture_output=True, text=True, check=False
            )
            print(out.stdout.strip() or out.stderr.strip()[-400:], flush=True)


if __name__ == "__main__":
    main()
