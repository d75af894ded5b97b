"""KernelBench's basics of a problem, the bottom floor of the reference side: loading the problem's code,
its seeding, the per-trial seeds, and the tensors inside a `get_inputs()` value.

kb_inputs (parallel input generation), kb_store (the on-disk input store) and kb_reference (the worker's
reference cache) all build on these; none of them imports another for them, so there is no circle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


def set_seed(seed: int) -> None:
    """KernelBench's set_seed: CPU generator and the current CUDA device's generator."""
    torch.manual_seed(seed)
    torch.cuda.manual_seed(seed)  # lazy when CUDA is not initialised: a compile worker stays CUDA-free


def trial_seeds(seed: int, trials: int) -> list[int]:
    """The per-trial seeds: manual_seed(seed), then `trials` draws of randint(0, 2**32 - 1)."""
    torch.manual_seed(seed)
    return [int(torch.randint(0, 2**32 - 1, (1,)).item()) for _ in range(trials)]


@dataclass
class ProblemCode:
    model: Any
    get_inputs: Any
    get_init_inputs: Any


def load_problem(code: str) -> ProblemCode:
    """Exec the reference into a fresh namespace, as KernelBench does."""
    namespace: dict[str, Any] = {}
    exec(compile(code, "<reference>", "exec"), namespace)  # noqa: S102 - the problem is trusted dataset code
    missing = [n for n in ("Model", "get_inputs", "get_init_inputs") if n not in namespace]
    if missing:
        raise NameError(f"reference code does not define {', '.join(missing)}")
    return ProblemCode(namespace["Model"], namespace["get_inputs"], namespace["get_init_inputs"])


def tensors(value: Any) -> list[torch.Tensor]:
    """Every tensor in a value, a list or a tuple (nested), in order."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in tensors(item)]
    return []
