"""Which step of a failing correctness check pays CUDA's lazy loading (issue 36): each step of
krefine's mismatch diagnosis (kb_correctness.compare_trial and mismatch_detail), timed on its first and
second call in a fresh process whose CUDA context exists and whose inputs (a 64 MB output and one off
by 1e-2, and their difference) are already made. One line per step:

    python3 bench/gpu/lazy_load.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HARNESS = Path(__file__).resolve().parents[2] / "src" / "harness"

STEPS = [
    "allclose",
    "max",
    "mean",
    "isfinite",
    "abs_mul_add",
    "le",
    "and_not",
    "ne",
    "bool_sum",
    "to_uint8",
    "argmax_uint8",
    "all",
    "unravel_index",
    "unravel",
    "compare_trial",
]


def child(step: str) -> dict[str, object]:
    sys.path.insert(0, str(HARNESS))
    import torch

    import kb_correctness

    device = torch.device("cuda:0")
    expected = torch.rand(4096, 4096, device=device)
    got = expected + 1e-2
    diff = torch.abs(expected - got)
    finite = torch.ones_like(diff, dtype=torch.bool)
    mask = diff > 0.5
    flat = mask.reshape(-1).to(torch.uint8) if step == "argmax_uint8" else None
    torch.cuda.synchronize(device)
    ops: dict[str, Callable[[], Any]] = {
        "allclose": lambda: torch.allclose(expected, got, atol=1e-4, rtol=1e-4),
        "max": lambda: torch.max(diff).item(),
        "mean": lambda: torch.mean(diff).item(),
        "isfinite": lambda: torch.isfinite(diff),
        "abs_mul_add": lambda: got.abs().mul_(1e-4).add_(1e-4),
        "le": lambda: diff <= got,
        "and_not": lambda: ~(mask & finite),
        "ne": lambda: expected != got,
        "bool_sum": lambda: int(mask.sum().item()),
        "to_uint8": lambda: mask.reshape(-1).to(torch.uint8),
        "argmax_uint8": lambda: int(flat.argmax().item()) if flat is not None else 0,
        "all": lambda: bool(finite.all().item()),
        "unravel_index": lambda: torch.unravel_index(torch.tensor(12345), expected.shape),
        "unravel": lambda: kb_correctness.unravel(12345, tuple(expected.shape)),
        "compare_trial": lambda: kb_correctness.compare_trial(expected, got, 1e-4, 1e-4, 0),
    }
    spans = []
    for _ in range(2):
        started = time.perf_counter()
        ops[step]()
        torch.cuda.synchronize(device)
        spans.append(round((time.perf_counter() - started) * 1000, 2))
    return {"step": step, "first_ms": spans[0], "second_ms": spans[1]}


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "child":
        print(json.dumps(child(sys.argv[2])))
        return
    for step in STEPS:
        out = subprocess.run([sys.executable, __file__, "child", step], capture_output=True, text=True, check=False)
        print(out.stdout.strip() or out.stderr.strip()[-400:], flush=True)


if __name__ == "__main__":
    main()
