"""How long the input store's hit check (kb_store._file_crcs) takes on a 2 GiB seed file in /dev/shm,
against the check before the fifth session of 2026-11-28 (each tensor read into a fresh buffer on one
thread, then checksummed on several), twice each, alternating; the checksums must agree.

    .venv/bin/python bench/store/hit_check.py
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "src", "harness"))
import kb_store

PATH = "/dev/shm/krefine-hit-check.bin"
N = 1 << 30
PART: dict[str, Any] = {"bytes": 2 * N, "items": [{"nbytes": N}, {"nbytes": N}]}


def before(path: str, part: dict[str, Any]) -> list[int]:
    crcs: list[int] = []
    with open(path, "rb") as f:
        for item in part["items"]:
            data = bytearray(int(item["nbytes"]))
            f.readinto(data)
            crcs.extend(kb_store._crcs(memoryview(data)))
    return crcs


def main() -> None:
    with open(PATH, "wb") as f:
        f.writelines(os.urandom(1 << 26) for _ in range(2 * N // (1 << 26)))
    try:
        for name, check in [("before", before), ("now", kb_store._file_crcs)] * 2:
            started = time.perf_counter()
            crcs = check(PATH, PART)
            print(f"{name:7} {time.perf_counter() - started:6.2f} s  ({len(crcs or [])} chunks)")
        assert before(PATH, PART) == kb_store._file_crcs(PATH, PART)
    finally:
        os.remove(PATH)


if __name__ == "__main__":
    main()
