"""Making a problem's seeded inputs in parallel processes when they are large.

KernelBench makes every input on the CPU with `torch.rand` and friends after `set_seed(seed)`. Torch's CPU
generator is serial, so KernelBench's largest level-1 inputs (1.6-2.1 G elements) take 10-20 s per seed,
and a problem needs six seeds (five correctness trials and the timing inputs). The seeds are independent,
so `prepare` makes them in spawned processes at once: each seeds its own generator exactly as the worker
would, so the values are bit for bit the same, and hands the tensors back through shared memory.

Strict timing's inputs no call has seen (`FreshInputs`): one set per timed call, from seeds derived from a
key or a secret.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import sys
from collections.abc import Callable
from typing import Any, Protocol

import torch
import torch.multiprocessing as torch_mp

import kb_problem
from kb_problem import tensors

# Below this many bytes for all the seeds together, the serial path is faster than starting processes
# (each imports torch, 2-5 s).
PARALLEL_MIN_BYTES = 2 << 30
# Share of the available RAM the generated inputs may take before they reach the device.
RAM_FRACTION = 0.5


def planned_bytes(get_inputs: Callable[[], list[Any]]) -> int | None:
    """Bytes one get_inputs() call makes, found on the meta device without making them; None when the
    problem's get_inputs does not run there (explicit devices, data-dependent code, ...)."""
    try:
        with torch.device("meta"):
            raw = get_inputs()
    except Exception:  # noqa: BLE001 - any failure just means "unknown"
        return None
    found = tensors(raw)
    if any(t.device.type != "meta" for t in found):
        return None
    return sum(t.numel() * t.element_size() for t in found)


def available_ram() -> int:
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def how_many_in_parallel(per_seed: int | None, seeds: int) -> int:
    """0 for the serial path; otherwise how many of the seeds to make in parallel processes."""
    if per_seed is None or seeds < 2 or per_seed * seeds < PARALLEL_MIN_BYTES:
        return 0
    fit = int(available_ram() * RAM_FRACTION) // max(per_seed, 1)
    count = min(seeds, fit, cpu_count())
    return count if count >= 2 else 0


def _make(code: str, seed: int) -> list[Any]:
    """In the child: KernelBench's set_seed(seed); get_inputs(), on the CPU, into shared memory."""
    torch.set_num_threads(1)
    problem = kb_problem.load_problem(code)
    kb_problem.set_seed(seed)
    raw = problem.get_inputs()
    for t in tensors(raw):
        if t.device.type != "cpu":
            raise ValueError(f"get_inputs made a tensor on {t.device}; only CPU inputs are made in parallel")
        t.share_memory_()
    return list(raw)


def make_in_parallel(code: str, seeds: list[int]) -> dict[int, list[Any]]:
    """Raw get_inputs() results per seed, made at once in spawned processes (fork is unsafe in a
    process that holds a CUDA context). Raises whatever a child raised."""
    context = torch_mp.get_context("spawn")
    # The children import kb_inputs from the harness folder, wherever the parent was started from.
    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.insert(0, here)
    with context.Pool(processes=len(seeds)) as pool:
        results = pool.starmap(_make, [(code, seed) for seed in seeds])
    return dict(zip(seeds, results, strict=True))


class FreshSource(Protocol):
    """What FreshInputs needs of kb_reference.ProblemContext."""

    device: torch.device

    def fresh_inputs(self, seed: int) -> list[Any]: ...


class FreshInputs:
    """Inputs no call has seen, for strict timing: call `call`'s set is get_inputs() under a seed derived
    from `key` and `call` (kb_reference.ProblemContext.fresh_inputs), in the worker's memory; kb_drive
    lends a copy of them to the candidate's process inside the call's span. `key` None draws a secret
    (`secrets`); kb_strict adds the checks."""

    def __init__(self, ctx: FreshSource, key: int | None) -> None:
        self.ctx = ctx
        self._key = secrets.randbits(64) if key is None else key

    def make(self, call: int) -> list[Any]:
        """Call `call`'s pristine inputs (-1: the warm-up set)."""
        digest = hashlib.blake2b(f"{self._key}:{call}".encode(), digest_size=8).digest()
        return self.ctx.fresh_inputs(int.from_bytes(digest, "little") & ((1 << 63) - 1))

    def close(self) -> None:
        """Nothing is held between calls (kept for the session's symmetry)."""
