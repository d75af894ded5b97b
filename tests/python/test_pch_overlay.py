"""kb_pch.lookup_pch through a sandboxed compile worker's view of the build cache: an overlay whose lower
folder is the shared cache, into which krefine publishes precompiled headers while the worker runs
(src/worker/build_store.rs, publish_pchs). A header published after the worker looked for it and missed
is found on the next look. (Before, overlayfs kept the miss: on the GPU host, 47 of 64 builds of a cold
batch missed headers published into the cache long before they started.)

The real kernel: a fresh user and mount namespace in a child process, a real overlay mount."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

HARNESS = Path(__file__).resolve().parents[2] / "src" / "harness"

CHILD = textwrap.dedent(
    r"""
    import ctypes, json, os, sys
    sys.path.insert(0, {harness!r})
    import kb_pch

    lower, upper, work, merged = {dirs!r}
    uid, gid = os.getuid(), os.getgid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(0x10000000 | 0x00020000) != 0:  # CLONE_NEWUSER | CLONE_NEWNS (os.unshare: 3.12)
        print(json.dumps({{"error": os.strerror(ctypes.get_errno())}}), flush=True)
        sys.exit(1)
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"0 {{uid}} 1")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"0 {{gid}} 1")
    options = f"lowerdir={{lower}},upperdir={{upper}},workdir={{work}}".encode()
    if libc.mount(b"overlay", merged.encode(), b"overlay", 0, options) != 0:
        print(json.dumps({{"error": os.strerror(ctypes.get_errno())}}), flush=True)
        sys.exit(1)
    root = __import__("pathlib").Path(merged) / "pch"
    flags = ["-O2"]
    compiler = sys.executable  # any program: only its identity goes into the key
    first = kb_pch.lookup_pch(root, compiler, flags)
    print(json.dumps({{"key": kb_pch.pch_key(compiler, flags), "first": first.header}}), flush=True)
    sys.stdin.readline()  # the header is published into the lower folder meanwhile
    again = kb_pch.lookup_pch(root, compiler, flags)
    print(json.dumps({{"again": again.header, "shared": again.shared}}), flush=True)
    """
)


def test_a_header_published_beneath_a_workers_overlay_after_a_miss_is_found(tmp_path: Path) -> None:
    dirs = [tmp_path / name for name in ("lower", "upper", "work", "merged")]
    for d in dirs:
        d.mkdir()
    # krefine makes the cache's header folder before any worker mounts its view (pool.rs, make_folders).
    (dirs[0] / "pch").mkdir()
    script = CHILD.format(harness=str(HARNESS), dirs=[str(d) for d in dirs])
    child = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None and child.stdin is not None
    first = json.loads(child.stdout.readline())
    assert "error" not in first, first
    assert first["first"] is None, "nothing is published yet"
    # Published as build_store.rs does: a complete folder renamed into place, with its marker.
    staging = dirs[0] / "pch" / f"{first['key']}.publish-1-0"
    staging.mkdir()
    (staging / "krefine_pch.h").write_text("#include <vector>\n")
    (staging / "krefine_pch.h.gch").write_bytes(b"gch")
    (staging / "krefine-published.json").write_text('{"published_by": 1}\n')
    staging.rename(dirs[0] / "pch" / first["key"])
    child.stdin.write("go\n")
    child.stdin.flush()
    again = json.loads(child.stdout.readline())
    assert child.wait(timeout=60) == 0
    assert again["again"] == str(dirs[3] / "pch" / first["key"] / "krefine_pch.h"), again
    assert again["shared"] is True
