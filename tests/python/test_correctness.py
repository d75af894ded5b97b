"""The comparison of a failing trial (kb_correctness): the first failing element's index, and what the
comparison costs a fresh candidate process."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import torch

import kb_correctness

HARNESS = Path(__file__).resolve().parents[2] / "src" / "harness"


def test_unravel_agrees_with_torch_on_every_shape() -> None:
    draw = random.Random(36)
    for _ in range(400):
        shape = tuple(draw.randint(1, 9) for _ in range(draw.randint(0, 5)))
        total = 1
        for size in shape:
            total *= size
        flat = draw.randrange(total)
        want = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), shape))
        assert kb_correctness.unravel(flat, shape) == want, (flat, shape)


def test_a_failing_comparison_names_the_first_failing_element() -> None:
    expected = torch.zeros(3, 4, 5)
    got = expected.clone()
    got[2, 1, 3] = 1.0
    got[2, 3, 0] = 2.0
    compared = kb_correctness.compare_trial(expected, got, 1e-4, 1e-4, 0)
    assert not compared.passed and compared.detail is not None
    assert compared.detail.first_index == (2, 1, 3)
    assert (compared.detail.expected, compared.detail.got, compared.detail.bad) == (0.0, 1.0, 2)


def test_a_failing_comparison_imports_nothing_new() -> None:
    """torch.unravel_index imports sympy on its first call: 1-2 s of every failing check in a fresh
    candidate process on the GPU host (bench/gpu/lazy_load.py). The check imports nothing."""
    script = (
        "import sys\n"
        f"sys.path.insert(0, {str(HARNESS)!r})\n"
        "import torch, kb_correctness\n"
        "before = set(sys.modules)\n"
        "expected = torch.rand(64, 64)\n"
        "compared = kb_correctness.compare_trial(expected, expected + 1e-2, 1e-4, 1e-4, 0)\n"
        "assert not compared.passed and compared.detail is not None\n"
        "print(' '.join(sorted(set(sys.modules) - before)))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=300)
    assert out.stdout.split() == [], out.stdout
