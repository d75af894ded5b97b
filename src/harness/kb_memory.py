"""Device memory: what a problem's reference data and a candidate of it take on the device, and how much of
krefine's own cached data may stay there beside them (the worker's admission, kb_reference.ReferenceCache).

KernelBench keeps one problem's data on the device at a time, in one process: the inputs, the reference's
output, the candidate's forward and the check's temporaries. krefine's worker also keeps reference data
(inputs, outputs) of this and other problems cached on the device, and the candidate runs in a process of
its own beside it. The rule that keeps krefine's caches from making a problem fail (issue 39):

- The reference's forward is measured when its first trial is built (`peak_of`: the bytes it allocated
  beyond what was there before, its output included), which gives the problem's `Footprint`.
- A candidate's working set is estimated from it (`Footprint.candidate`): its own forward as large as the
  reference's, the check's temporaries (`torch.allclose` on outputs of that size, COMPARE_FACTOR times the
  output), a CUDA context. The buffers the worker lends its process (`Footprint.lent`), and the worker's
  own transient need while serving it (`Footprint.serving`): a trial's data made per use, or strict
  timing's and the fresh-input probe's inputs and checked calls, compared in slices (SLICE_ELEMENTS).
- Before a request reaches the reference (`ReferenceCache.make_room`) and whenever a trial is placed, the
  cache keeps on the device only what fits beside both, plus HEADROOM_FRACTION of the device; other
  problems' cached data gives way first (least recently used first), then this problem's own, which moves
  to host memory or is made again per use, with the same bits.
- Where KernelBench's own flow could not fit either (`Footprint.kernelbench` over what the device can give
  krefine), the problem does not fit the device: the verdict is a reference error with these figures
  (`does_not_fit`), never the candidate's fault.

Before a problem's reference has run, its need is NEED_FACTOR times its planned input bytes (kb_inputs).
"""

from __future__ import annotations

import contextlib
import gc
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

GIB = 1 << 30
# Share of memory the reference cache may hold at most: on the GPU for a CUDA device, in RAM otherwise (the
# room beside a candidate, below, usually decides on the GPU). Half the GPU keeps every trial input of
# KernelBench's largest level-1 problems (6-9 GB each) on an 80 GB device when their candidates are small.
DEVICE_CACHE_FRACTION = 0.5
HOST_CACHE_FRACTION = 0.35
CPU_DEVICE_CACHE_FRACTION = 0.25
# Before a problem's reference ran (no footprint yet): three times its planned input bytes (its inputs, the
# reference's output, the candidate's output) must be free.
NEED_FACTOR = 3
# Kept free beyond every estimate: allocator slack, kernels' workspaces, fragmentation.
HEADROOM_FRACTION = 0.05
# torch.allclose's temporaries, in bytes of the compared output: isclose holds |a - b|, rtol * |b| + atol,
# a subtraction's result and a few boolean masks at once (3.25x for fp32, 3.5x for half precision).
COMPARE_FACTOR = 3.5
# A candidate process's CUDA context and its allocator's first blocks (about 0.5 GB on an H100).
CONTEXT_BYTES = GIB
# The worker compares outputs in slices of at most this many elements (kb_correctness.sliced_allclose), so
# its temporaries are one slice's (8-byte elements at the most), not a whole output's: on level 1's 8 GiB
# outputs, 28 GiB beside the candidate's process would push the problem off an 80 GB card.
SLICE_ELEMENTS = 1 << 25
SLICE_CHECK_BYTES = int(COMPARE_FACTOR * SLICE_ELEMENTS * 8)


def headroom(total: int) -> int:
    return int(total * HEADROOM_FRACTION)


def need_bytes(planned: int, total: int) -> int:
    """Free device memory a problem of `planned` input bytes needs before its reference has run, on a
    device of `total` bytes."""
    return NEED_FACTOR * planned + headroom(total)


@dataclass(frozen=True)
class Footprint:
    """One problem's sizes on the device, measured when its trials were built: one input set, the
    reference's output, and its forward's peak (what the forward allocated beyond what was there before
    it: the output and every intermediate and workspace)."""

    inputs: int
    output: int
    forward: int

    def check(self) -> int:
        """The temporaries of comparing one output with the expected one at once (KernelBench's
        torch.allclose, in the candidate's process in faithful mode)."""
        return int(COMPARE_FACTOR * self.output)

    def worker_check(self) -> int:
        """The temporaries of the worker's comparison, made slice by slice."""
        return min(self.check(), SLICE_CHECK_BYTES)

    def candidate(self, strict: bool = False) -> int:
        """A candidate process's working set: a forward as large as the reference's, its CUDA context,
        and in faithful mode its check (compared in its own process, as KernelBench does; its allocator
        keeps those blocks until krefine's servant empties it after KernelBench's loop), in strict mode
        the clones of its inputs (the worker compares)."""
        return self.forward + (self.inputs if strict else self.check()) + CONTEXT_BYTES

    def lent(self, strict: bool = False) -> int:
        """The buffers the worker allocates and the candidate's process maps (kb_exchange): one input set
        and one output slot, and in faithful mode a trial's expected output too (KernelBench's timing
        inputs go into the input set's buffers)."""
        return self.inputs + self.output + (0 if strict else self.output)

    def serving(self) -> int:
        """The worker's own transient need while serving a candidate, at the most: a call checked on
        fresh inputs (strict trials and timing, faithful mode's fresh-input probe): the pristine set, the
        output's private copy, and either the reference's forward on a clone of the set or the sliced
        comparison. Covers a trial made or copied up per use (its inputs and the forward)."""
        return self.inputs + self.output + max(self.inputs + self.forward, self.output + self.worker_check())

    def reserve(self, total: int, strict: bool = False) -> int:
        """What must stay free beside krefine's cached data while a candidate of this problem runs, at its
        peak. Strict mode: the process's working set, the lent buffers and the worker's serving at once.
        Faithful mode: the larger of KernelBench's loop in the process (its working set, check included,
        beside the lent input set and expected output and a trial made per use) and the probes after it
        (the process's forward and context, its allocator emptied, beside every lent buffer and the
        worker's checked calls)."""
        if strict:
            peak = self.candidate(True) + self.lent(True) + self.serving()
        else:
            loop = self.candidate() + self.inputs + self.output + self.inputs + self.forward
            probes = self.forward + CONTEXT_BYTES + self.lent() + self.serving()
            peak = max(loop, probes)
        return peak + headroom(total)

    def kernelbench(self) -> int:
        """What KernelBench's own flow holds at its peak, in one process: the inputs, the reference's
        output, a candidate's forward and the check's temporaries, one CUDA context."""
        return self.inputs + self.output + self.forward + self.check() + CONTEXT_BYTES

    def merged(self, other: Footprint) -> Footprint:
        """The larger of two trials' figures (inputs and outputs have one size; a forward may vary)."""
        return Footprint(
            max(self.inputs, other.inputs), max(self.output, other.output), max(self.forward, other.forward)
        )


@dataclass(frozen=True)
class DeviceState:
    """One look at a CUDA device: its size, what is free on it (every process's use counts), and what
    this process's allocator holds without using (torch.cuda.empty_cache gives it back)."""

    total: int
    free: int
    idle: int

    @property
    def available(self) -> int:
        return self.free + self.idle


def device_state(device: torch.device) -> DeviceState:
    free, total = torch.cuda.mem_get_info(device)
    idle = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return DeviceState(total=int(total), free=int(free), idle=max(int(idle), 0))


def cache_room(state: DeviceState, cached: int, holding: int, footprint: Footprint, strict: bool = False) -> int:
    """The most krefine's cache may hold on a device beside a candidate of a problem of `footprint`:
    what the device can give krefine (its available memory, the `cached` data, which can give way, and
    `holding`, data allocated already that is being placed) less the reserve (0 when that is all)."""
    return max(state.available + cached + holding - footprint.reserve(state.total, strict), 0)


# The most this process's allocator reserved since `reset_worker_peak`, kept across the resets `peak_of`
# makes (torch has one peak counter per device).
_high_water: dict[int, int] = {}


def reset_worker_peak(device: torch.device) -> None:
    """Start counting the worker's peak device memory (its allocator's reservation) afresh."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        _high_water[_index(device)] = 0


def worker_peak(device: torch.device) -> int:
    """The most this process's allocator reserved on `device` since `reset_worker_peak`."""
    if device.type != "cuda":
        return 0
    return max(_high_water.get(_index(device), 0), int(torch.cuda.max_memory_reserved(device)))


@contextlib.contextmanager
def peak_of(device: torch.device) -> Iterator[list[int]]:
    """Measure the device bytes allocated during the block beyond what was allocated before it: the
    yielded list holds the figure once the block ends (empty on the CPU, where torch keeps no count)."""
    found: list[int] = []
    if device.type != "cuda":
        yield found
        return
    index = _index(device)
    _high_water[index] = max(_high_water.get(index, 0), int(torch.cuda.max_memory_reserved(device)))
    base = int(torch.cuda.memory_allocated(device))
    torch.cuda.reset_peak_memory_stats(device)
    yield found
    found.append(max(int(torch.cuda.max_memory_allocated(device)) - base, 0))


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def evictions(free: int, need: int, cached: list[tuple[Any, int]]) -> tuple[list[Any], bool]:
    """Memory admission, a pure decision: which of the `cached` entries (key, device bytes; least
    recently used first) to evict so that `need` bytes fit in `free` plus what they release. Returns
    (keys to evict, whether `need` then fits). Nothing is evicted when it fits already; every entry
    holding bytes is when even that is not enough (the work then runs with all krefine could free);
    entries holding nothing are never evicted."""
    if need <= free:
        return [], True
    evict: list[Any] = []
    for key, held in cached:
        if held <= 0:
            continue
        evict.append(key)
        free += held
        if need <= free:
            return evict, True
    return evict, False


def memory_budgets(device: torch.device) -> tuple[int, int]:
    """(device budget, host budget) in bytes for cached reference data, at most."""
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        return int(total * DEVICE_CACHE_FRACTION), int(ram * HOST_CACHE_FRACTION)
    return int(ram * CPU_DEVICE_CACHE_FRACTION), 0


def freeze_startup_objects() -> None:
    """Move every object alive now (torch's and the harness's, imported at start-up) out of the garbage
    collector's reach for the rest of the process: `release_memory`'s full collection then walks only
    what was made since, instead of some 160,000 objects (0.1 s a collection, once in the worker and
    once in the candidate's process per evaluation, inside the lease). Objects made later are collected
    as before; what is frozen is what the process keeps for its life anyway."""
    gc.freeze()


# Collections between two that walk every object again (`collect`).
SETTLE_EVERY = 64
_released = 0
_let_go = False


def let_go() -> None:
    """Long-lived data was just let go (a problem's cached reference data dropped or moved off its
    device): the next `collect` walks every object again, so that cycles among what earlier
    collections froze (a problem's code: its functions' globals hold its classes) give their memory,
    device memory included, back now."""
    global _let_go
    _let_go = True


def collect() -> None:
    """A full collection of what the last job made. What survives it is frozen (`gc.freeze`): the next
    collection walks only what was made since. In a GPU worker that had run for a while, a collection
    that walked everything alive cost 45-60 ms per evaluation inside the lease (docs/benchmarks.md,
    tenth session); the data the worker keeps across jobs is what such walks found alive every time.
    Frozen objects are still freed when their last reference goes; only a cycle among them waits, until
    a collection that walks everything again: after `let_go`, and every `SETTLE_EVERY` collections in
    any case."""
    global _released, _let_go
    _released += 1
    if _let_go or _released % SETTLE_EVERY == 0:
        gc.unfreeze()
        _let_go = False
    gc.collect()
    gc.freeze()


def release_memory(device: torch.device, spent: Callable[[str, float], None] | None = None) -> None:
    """Give back what the last job made and no longer uses: `collect`, then the CUDA allocator's unused
    cache. With `spent`, each step is reported as it ends (`"gc"`, `"cache"`, with its start on
    `time.perf_counter`) for the lease trace."""
    started = time.perf_counter()
    collect()
    if spent is not None:
        spent("gc", started)
    if device.type == "cuda":
        started = time.perf_counter()
        torch.cuda.empty_cache()
        if spent is not None:
            spent("cache", started)


def gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


def figures(
    total: int, available: int, held: int, footprint: Footprint | None, planned: int | None, strict: bool = False
) -> dict[str, Any]:
    """The memory figures a verdict records (`metadata.device_memory`), in bytes."""
    out: dict[str, Any] = {"total_bytes": total, "available_bytes": available, "krefine_held_bytes": held}
    if footprint is not None:
        out.update(
            inputs_bytes=footprint.inputs,
            output_bytes=footprint.output,
            reference_forward_bytes=footprint.forward,
            candidate_estimate_bytes=footprint.candidate(strict),
            kernelbench_needs_bytes=footprint.kernelbench(),
        )
    elif planned:
        out["inputs_bytes"] = planned
    return out


def problem_does_not_fit(numbers: dict[str, Any], reference_failed: bool, candidate_failed: bool) -> bool:
    """Does a result that ran out of memory (`reference_failed`: the reference; `candidate_failed`: the
    candidate, its CUDA context still usable) say the problem does not fit the device, from `figures`
    taken with krefine's caches counted as available? The reference: when its own need (one input set
    and its forward) is over what the device can give krefine; before its first forward ran, when
    `NEED_FACTOR` times its planned input set is; never when nothing of its size is known (krefine cannot
    tell, and says so: `unexplained_out_of_memory`). A reference that fits alone ran out beside a
    candidate's memory or krefine's own, which stays as it was. A candidate: when KernelBench's own flow
    could not fit either (`Footprint.kernelbench`)."""
    available = int(numbers.get("available_bytes", 0))
    if reference_failed:
        if "reference_forward_bytes" in numbers:
            return int(numbers["inputs_bytes"]) + int(numbers["reference_forward_bytes"]) > available
        if "inputs_bytes" in numbers:
            return NEED_FACTOR * int(numbers["inputs_bytes"]) > available
        return False
    needs = numbers.get("kernelbench_needs_bytes")
    return candidate_failed and needs is not None and int(needs) > available


def unexplained_out_of_memory(numbers: dict[str, Any]) -> str:
    """The plain sentence of a reference that ran out of memory (after one retry with its data off the
    device) although, by the figures krefine has, the problem fits the device: krefine's, to report."""
    parts = [f"the device has {gib(numbers['total_bytes'])}", f"{gib(numbers['available_bytes'])} of it free to krefine"]
    if "inputs_bytes" in numbers:
        parts.append(f"one input set takes {gib(numbers['inputs_bytes'])}")
    return (
        "The reference ran out of memory although, by krefine's figures, this problem fits this device ("
        + "; ".join(parts)
        + "): the memory went to krefine's own data and buffers. This is neither your code's nor the "
        "problem's fault; please report it to krefine."
    )


def does_not_fit(numbers: dict[str, Any], reference_failed: bool) -> str:
    """The plain sentence of a problem that does not fit the device (a reference error, not the
    candidate's fault), from `figures`."""
    parts = [f"the device has {gib(numbers['total_bytes'])}", f"{gib(numbers['available_bytes'])} of it free to krefine"]
    if "kernelbench_needs_bytes" in numbers:
        parts.append(
            f"KernelBench's own evaluation needs about {gib(numbers['kernelbench_needs_bytes'])} at once (inputs "
            f"{gib(numbers['inputs_bytes'])}, reference output {gib(numbers['output_bytes'])}, a forward "
            f"{gib(numbers['reference_forward_bytes'])}, the check's temporaries)"
        )
    elif "inputs_bytes" in numbers:
        parts.append(f"one input set takes {gib(numbers['inputs_bytes'])}")
    what = "its reference ran out of memory" if reference_failed else "a candidate as large as its reference cannot run beside it"
    return (
        f"This problem does not fit this device: {what} with none of krefine's cached data on the device ("
        + "; ".join(parts)
        + "). KernelBench's own evaluation runs out of memory here too; this is not your code's fault."
    )
