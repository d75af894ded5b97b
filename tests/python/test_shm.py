"""kb_shm: what a candidate left in the worker's /dev/shm is swept, what a living process holds stays."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import kb_shm


def test_sweep_removes_what_no_process_holds_and_keeps_what_one_holds(tmp_path: Path) -> None:
    root = tmp_path / "shm"
    root.mkdir()
    (root / "left-note").write_text("left by a candidate")
    (root / "left-dir").mkdir()
    (root / "left-dir" / "inner").write_text("x")
    opened = root / "held-open"
    opened.write_text("a living process has it open")
    mapped = root / "held-mapped"
    mapped.write_bytes(b"\0" * 4096)
    (root / "held-dir").mkdir()
    inside = root / "held-dir" / "lock"
    inside.write_text("held")
    with opened.open() as _f1, inside.open() as _f2, mapped.open("r+b") as f3:
        view = mmap.mmap(f3.fileno(), 4096)
        f3.close()  # only the mapping holds it now
        removed = kb_shm.sweep(str(root))
        view.close()
    assert sorted(removed) == ["left-dir", "left-note"]
    assert sorted(os.listdir(root)) == ["held-dir", "held-mapped", "held-open"]


def test_a_worker_without_its_own_shm_sweeps_nothing(tmp_path: Path) -> None:
    (tmp_path / "note").write_text("the machine's, not the worker's")
    sweeper = kb_shm.ShmSweeper(private=False, root=str(tmp_path))
    assert not sweeper.has_leftovers()
    sweeper.after_candidates()
    assert (tmp_path / "note").exists()
    private = kb_shm.ShmSweeper(private=True, root=str(tmp_path))
    assert private.has_leftovers()
    private.after_candidates()
    assert private.removed == 1 and not private.has_leftovers()
