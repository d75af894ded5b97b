"""A smaller card on a larger one, for issue 39's memory checks: a separate process holds all of a CUDA device
but `leave` bytes for as long as the context is open, so every other process (krefine's worker, the
candidate's process) finds free what a card of that size would leave it (cudaMemGetInfo counts every
process's use, and krefine's admission decides on what is free).

    with Ballast(leave=81559 * MIB) as b:   # an H100 80GB HBM3 reports 81559 MiB in all
        ...                                  # b.pid: leave it out of per-process samples

What it does not change: the device's reported total (torch's `total_memory`, nvidia-smi's `memory.total`),
so krefine's budget for cached reference data (a fraction of the total) is larger than on the real smaller
card: the emulation is harsher on the cache than the card would be, not kinder. Nor the card's speed.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Self

MIB = 1 << 20

# Run in its own process: hold the device's free memory but `leave` bytes, say so, wait to be ended.
_HOLDER = """
import signal, sys, torch
leave, index = int(sys.argv[1]), int(sys.argv[2])
device = torch.device("cuda", index)
free, total = torch.cuda.mem_get_info(device)
held = torch.empty(max(free - leave, 0), dtype=torch.uint8, device=device)
free, _ = torch.cuda.mem_get_info(device)
print(held.numel(), free, total, flush=True)
signal.sigwait({signal.SIGTERM, signal.SIGINT})
"""


class Ballast:
    """Hold a device's memory but `leave` bytes in a child process while the context is open."""

    def __init__(self, leave: int, index: int = 0) -> None:
        self.leave = leave
        self.index = index
        self.pid: int | None = None
        self.held = 0
        self.free = 0
        self.total = 0
        self._proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> Self:
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _HOLDER, str(self.leave), str(self.index)], stdout=subprocess.PIPE, text=True
        )
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline().split()
        if len(line) != 3:
            self._proc.kill()
            raise RuntimeError(f"the ballast process did not hold the device (exit {self._proc.wait()})")
        self.held, self.free, self.total = (int(x) for x in line)
        self.pid = self._proc.pid
        print(
            f"ballast: pid {self.pid} holds {self.held // MIB} MiB of device {self.index} "
            f"({self.total // MIB} MiB): {self.free // MIB} MiB free for the rest",
            flush=True,
        )
        return self

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait()

    def describe(self) -> dict[str, int]:
        return {
            "ballast_mib": self.held // MIB,
            "left_free_mib": self.free // MIB,
            "device_total_mib": self.total // MIB,
        }


class NoBallast:
    """The whole card (no `--leave-mib`)."""

    pid: int | None = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def describe(self) -> dict[str, int]:
        return {}


def ballast(leave_mib: int, index: int = 0) -> Ballast | NoBallast:
    return Ballast(leave_mib * MIB, index) if leave_mib > 0 else NoBallast()
