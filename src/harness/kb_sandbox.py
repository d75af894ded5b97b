"""Per-candidate confinement inside a worker (README "Threat model").

`enter_candidate` is called in each single-use candidate process (compile or evaluate) after the
trusted harness state is set up and before any candidate code is imported. It restricts what the
process may write (its own scratch and build directory) and reports what it applied, so every
result can record the sandbox it ran in. The worker process itself is confined by the orchestrator
(namespaces set up when it is spawned); this is the layer that separates one candidate from the next
inside one worker.

Layers, each applied where the kernel has it (irreversible for this process and its children):
- `no_new_privs`: no set-uid or file-capability binary can raise privileges.
- `landlock-fs`: writes (create, delete, rename, truncate, write) only beneath `scratch`, the
  `writable` paths and /dev (device nodes: /dev/null, /dev/nvidia*); reading stays allowed.
- `landlock-net` (Landlock ABI 4+): no TCP bind or connect.
- `landlock-scope` (ABI 6+): no signals to processes outside this domain (the worker that started
  it, the orchestrator) and no abstract unix sockets outside it.
"""

from __future__ import annotations

import ctypes
import os
import platform
import tempfile
from typing import Any

PR_SET_NO_NEW_PRIVS = 38
# Landlock system calls have the same numbers on every architecture that has them (asm-generic).
SYS_LANDLOCK_CREATE_RULESET = 444
SYS_LANDLOCK_ADD_RULE = 445
SYS_LANDLOCK_RESTRICT_SELF = 446
LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_RULE_PATH_BENEATH = 1

# linux/landlock.h access rights
FS_EXECUTE = 1 << 0
FS_WRITE_FILE = 1 << 1
FS_READ_FILE = 1 << 2
FS_READ_DIR = 1 << 3
FS_REMOVE_DIR = 1 << 4
FS_REMOVE_FILE = 1 << 5
FS_MAKE_CHAR = 1 << 6
FS_MAKE_DIR = 1 << 7
FS_MAKE_REG = 1 << 8
FS_MAKE_SOCK = 1 << 9
FS_MAKE_FIFO = 1 << 10
FS_MAKE_BLOCK = 1 << 11
FS_MAKE_SYM = 1 << 12
FS_REFER = 1 << 13  # ABI 2
FS_TRUNCATE = 1 << 14  # ABI 3
NET_BIND_TCP = 1 << 0  # ABI 4
NET_CONNECT_TCP = 1 << 1  # ABI 4
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6
SCOPE_SIGNAL = 1 << 1  # ABI 6

WRITE_ACCESS_V1 = (
    FS_WRITE_FILE
    | FS_REMOVE_DIR
    | FS_REMOVE_FILE
    | FS_MAKE_CHAR
    | FS_MAKE_DIR
    | FS_MAKE_REG
    | FS_MAKE_SOCK
    | FS_MAKE_FIFO
    | FS_MAKE_BLOCK
    | FS_MAKE_SYM
)
# Rights that apply to a file (not a folder) in a path-beneath rule.
FILE_ACCESS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def landlock_abi() -> int:
    """The Landlock ABI version this kernel offers (0: none)."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "aarch64"):
        return 0
    libc = _libc()
    libc.syscall.restype = ctypes.c_long
    version = libc.syscall(
        ctypes.c_long(SYS_LANDLOCK_CREATE_RULESET),
        None,
        ctypes.c_size_t(0),
        ctypes.c_uint32(LANDLOCK_CREATE_RULESET_VERSION),
    )
    return max(0, int(version))


def _write_access(abi: int) -> int:
    access = WRITE_ACCESS_V1
    if abi >= 2:
        access |= FS_REFER
    if abi >= 3:
        access |= FS_TRUNCATE
    return access


def _restrict(abi: int, writable: list[str]) -> list[str]:
    libc = _libc()
    libc.syscall.restype = ctypes.c_long
    handled = _write_access(abi)
    attr = _RulesetAttr(handled, NET_BIND_TCP | NET_CONNECT_TCP if abi >= 4 else 0, 0)
    if abi >= 6:
        attr.scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL
    size = 8 if abi < 4 else (16 if abi < 6 else 24)
    ruleset = libc.syscall(
        ctypes.c_long(SYS_LANDLOCK_CREATE_RULESET), ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0)
    )
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset: " + os.strerror(ctypes.get_errno()))
    try:
        rules: list[tuple[str, int]] = [(p, handled) for p in writable]
        rules.append(("/dev", FS_WRITE_FILE))  # device nodes: /dev/null, /dev/nvidia*
        # torch.multiprocessing shares tensors with the worker through shared-memory files (the
        # worker's own private /dev/shm when it runs in the namespaces sandbox).
        rules.append(("/dev/shm", handled))
        for path, access in rules:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue  # a path that does not exist grants nothing
            try:
                if not os.path.isdir(path):
                    access &= FILE_ACCESS
                rule = _PathBeneathAttr(access, fd)
                r = libc.syscall(
                    ctypes.c_long(SYS_LANDLOCK_ADD_RULE),
                    ctypes.c_int(ruleset),
                    ctypes.c_int(LANDLOCK_RULE_PATH_BENEATH),
                    ctypes.byref(rule),
                    ctypes.c_uint32(0),
                )
                if r < 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"landlock_add_rule({path}): {os.strerror(err)}")
            finally:
                os.close(fd)
        if libc.syscall(ctypes.c_long(SYS_LANDLOCK_RESTRICT_SELF), ctypes.c_int(ruleset), ctypes.c_uint32(0)) < 0:
            err = ctypes.get_errno()
            raise OSError(err, "landlock_restrict_self: " + os.strerror(err))
    finally:
        os.close(ruleset)
    layers = [f"landlock-fs(abi {abi})"]
    if abi >= 4:
        layers.append("landlock-net")
    if abi >= 6:
        layers.append("landlock-scope")
    return layers


def _private_tmp(scratch: str, writable: list[str]) -> None:
    """Point temporary files (compilers', Python's) at the candidate's own scratch when TMPDIR is not
    among the folders it may write: once confined, a shared `/tmp` is no longer writable."""
    allowed = [os.path.abspath(p) for p in [scratch, *writable]]
    current = os.path.abspath(os.environ.get("TMPDIR") or tempfile.gettempdir())
    if not any(current == a or current.startswith(a + os.sep) for a in allowed):
        os.environ["TMPDIR"] = os.path.abspath(scratch)
        tempfile.tempdir = None  # recomputed from TMPDIR on next use


def enter_candidate(scratch: str, writable: list[str]) -> dict[str, Any]:
    """Confine the calling process; returns `{"layers": [...]}` naming what was applied.

    Writes are allowed only beneath `scratch` and `writable` (folders or files). Call it in a
    process that runs one candidate and then exits: nothing here can be undone.
    """
    layers: list[str] = []
    _private_tmp(scratch, writable)
    libc = _libc()
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0:
        layers.append("no_new_privs")
    abi = landlock_abi()
    if abi > 0:
        paths = [os.path.abspath(p) for p in [scratch, *writable]]
        layers.extend(_restrict(abi, paths))
    return {"layers": layers}
