"""The worker's `/dev/shm` between candidates: what a candidate process left there goes with it.

A candidate process may write `/dev/shm` (Landlock grants it: shared-memory files are how libraries
share memory between processes), so without this a candidate could leave a file there for the next
candidate of the same worker: outputs computed by an honest, slow candidate, read back by a later one
that skips the work. In the namespaces sandbox the worker's `/dev/shm` is its own empty tmpfs (its
candidates share it, no other process does), so once a candidate process and everything it started are
gone, every entry there that no living process of the worker holds (open or mapped) is a candidate's
leftover, and is removed. Mount points (the input store's in-memory tier, bound read-only) stay.

Outside that sandbox `/dev/shm` is the machine's, shared with processes that are none of the worker's
business: nothing is swept there (README "Threat model" says so).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys

SHM = "/dev/shm"


def held_under(root: str) -> set[str]:
    """Paths beneath `root` that a process this one can see holds open (a descriptor) or mapped."""
    held: set[str] = set()
    prefix = root.rstrip("/") + "/"
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return held
    for pid in pids:
        fd_dir = f"/proc/{pid}/fd"
        with contextlib.suppress(OSError):
            for fd in os.listdir(fd_dir):
                with contextlib.suppress(OSError):
                    target = os.readlink(os.path.join(fd_dir, fd))
                    if target.startswith(prefix):
                        held.add(target.removesuffix(" (deleted)"))
        with contextlib.suppress(OSError), open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                # address perms offset dev inode path: the path is the sixth field, and may hold spaces.
                fields = line.split(maxsplit=5)
                if len(fields) == 6 and fields[5].startswith(prefix):
                    held.add(fields[5].rstrip("\n").removesuffix(" (deleted)"))
    return held


def sweep(root: str = SHM) -> list[str]:
    """Remove every entry of `root` that no process holds (and that is no mount point); returns the
    names removed. Call it when no candidate process of this worker is alive."""
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return []
    if not names:
        return []
    held = held_under(root)
    removed: list[str] = []
    for name in names:
        path = os.path.join(root, name)
        if path in held or any(h.startswith(path + "/") for h in held):
            continue
        if os.path.ismount(path):
            continue
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)
        except OSError:
            continue
        removed.append(name)
    return removed


class ShmSweeper:
    """Sweeps the worker's private `/dev/shm` after each candidate process (module doc); does nothing
    where the worker does not own it."""

    def __init__(self, private: bool, root: str = SHM) -> None:
        self.private = private
        self.root = root
        # Entries removed so far (tests assert it; the log says it).
        self.removed = 0

    def has_leftovers(self) -> bool:
        """Whether there is anything to sweep (cheap: one directory listing, no /proc scan)."""
        if not self.private:
            return False
        try:
            return any(not os.path.ismount(os.path.join(self.root, n)) for n in os.listdir(self.root))
        except OSError:
            return False

    def after_candidates(self) -> None:
        """Sweep; call it when no candidate process of the worker is alive."""
        if not self.private:
            return
        removed = sweep(self.root)
        if removed:
            self.removed += len(removed)
            shown = ", ".join(removed[:5]) + (" ..." if len(removed) > 5 else "")
            print(
                f"krefine harness: removed {len(removed)} entr{'y' if len(removed) == 1 else 'ies'} a candidate left in "
                f"{self.root}: {shown}",
                file=sys.stderr,
            )
