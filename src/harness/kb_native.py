"""Strict mode's native timing loop (kb_native_timer.cpp): built by the trusted side, sealed, loaded into
each candidate process before the candidate is imported.

The loop's source ships with the harness. The worker (which runs no candidate code) builds it on its
first strict evaluation with the C++ compiler and Python's headers (no torch or CUDA headers: the module
reaches the CUDA driver through dlopen, so a build takes about a second), into a folder next to the
deployed harness named by a digest of the source, the Python and the compiler; the file is published
by an atomic rename and made read-only, and a later worker reuses it. A worker whose sandbox shows that
folder read-only (or not at all) builds privately under its scratch instead, once per worker process. The worker keeps the image's
bytes and their SHA-256, loads it into itself (the reference's strict timing uses the same loop), and
hands the bytes to each strict candidate process in its job; that process loads them from a sealed
memfd (`load`) before the candidate's module is imported, so nothing a candidate wrote on disk can
reach the loop.

If the module cannot be built (no compiler, no Python headers), strict mode refuses to evaluate and
says why (`NativeTimerUnavailable`); it never falls back to the Python loop. Faithful mode does not
use this module.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

SOURCE_NAME = "kb_native_timer.cpp"
MODULE_NAME = "kb_native_timer"
HARNESS_DIR = Path(__file__).resolve().parent
BUILD_TIMEOUT_S = 300.0
# Where built images live: KREFINE_NATIVE_DIR, else next to the deployed harness folder.
DIR_ENV = "KREFINE_NATIVE_DIR"


class NativeTimerUnavailable(RuntimeError):
    """Strict mode's native timing loop cannot be built or loaded here."""


# This process's loaded module (None: not loaded) and, in the worker, the image it built or found.
_module: Any = None
_image: bytes | None = None
_failure: str | None = None


def cache_root() -> Path:
    configured = os.environ.get(DIR_ENV)
    return Path(configured) if configured else HARNESS_DIR.parent / "native-timer"


def compiler() -> str:
    return os.environ.get("CXX") or "c++"


def build_key(source: bytes, cxx: str) -> str:
    """What an image depends on: the source, the Python that loads it, the compiler (its --version)."""
    try:
        version = subprocess.run(
            [cxx, "--version"], capture_output=True, text=True, timeout=30, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise NativeTimerUnavailable(f"no C++ compiler ({cxx}): {exc}") from None
    digest = hashlib.sha256()
    for part in (source, sys.version.encode(), str(sysconfig.get_config_var("EXT_SUFFIX")).encode(), version.encode()):
        digest.update(len(part).to_bytes(8, "little"))
        digest.update(part)
    return digest.hexdigest()[:20]


def build(root: Path) -> Path:
    """The image for this source, Python and compiler under `root`: reused when there, else built in a
    private folder and published by rename. Raises NativeTimerUnavailable with the compiler's words."""
    source = (HARNESS_DIR / SOURCE_NAME).read_bytes()
    cxx = compiler()
    target = root / build_key(source, cxx) / f"{MODULE_NAME}.so"
    if target.is_file():
        return target
    include = sysconfig.get_paths()["include"]
    if not (Path(include) / "Python.h").is_file():
        raise NativeTimerUnavailable(f"Python's headers are missing ({include}/Python.h; install python3-dev)")
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".build-", dir=target.parent))
    try:
        (work / SOURCE_NAME).write_bytes(source)
        command = [
            cxx, "-O2", "-std=c++17", "-shared", "-fPIC", "-fvisibility=hidden",
            f"-I{include}", str(work / SOURCE_NAME), "-o", str(work / "out.so"), "-ldl",
        ]  # fmt: skip
        try:
            # The compiler's temporary files go to the build folder: a sandboxed worker's /tmp may be hidden.
            env = dict(os.environ, TMPDIR=str(work))
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False, env=env
            )
        except (OSError, subprocess.SubprocessError) as exc:
            raise NativeTimerUnavailable(f"cannot run the C++ compiler {cxx}: {exc}") from None
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip()[-2000:]
            raise NativeTimerUnavailable(f"{cxx} failed (exit {done.returncode}): {tail}")
        os.chmod(work / "out.so", 0o444)
        os.replace(work / "out.so", target)  # atomic: a concurrent worker sees all of it or nothing
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


def ensure() -> bytes:
    """In the worker: the image (built or reused once per process) and the module loaded here. Raises
    NativeTimerUnavailable, the same way on every call once it failed."""
    global _image, _failure
    if _image is not None:
        return _image
    if _failure is not None:
        raise NativeTimerUnavailable(_failure)
    try:
        started = time.perf_counter()
        where, image = _build_and_read()
        load(image)
    except NativeTimerUnavailable as exc:
        _failure = str(exc)
        raise
    except OSError as exc:
        _failure = f"cannot build or read the native timer under {cache_root()}: {exc}"
        raise NativeTimerUnavailable(_failure) from None
    _image = image
    print(
        f"krefine harness: strict timing's native loop loaded from {where} ({time.perf_counter() - started:.1f} s, "
        f"sha256 {digest(image)[:12]})",
        file=sys.stderr,
        flush=True,
    )
    return image


def _build_and_read() -> tuple[str, bytes]:
    """(where, image): from the shared folder (reused or built there), or, where this worker may not
    write it (its sandbox shows that folder read-only or not at all), built in a private folder under
    the worker's scratch (its working folder) and read at once: a worker never loads an image from a
    folder candidates may write unless it built it there itself, this moment."""
    try:
        path = build(cache_root())
        return str(path), path.read_bytes()
    except OSError:
        pass
    private = Path(tempfile.mkdtemp(prefix=".native-timer-", dir=os.getcwd()))
    try:
        return f"a private build in {private}", build(private).read_bytes()
    finally:
        shutil.rmtree(private, ignore_errors=True)


def digest(image: bytes) -> str:
    return hashlib.sha256(image).hexdigest()


def load(image: bytes) -> None:
    """Load `image` into this process from a memfd sealed against writes (no file a candidate could
    swap between a check and the load), or where memfds may not be executed, from a private file
    removed once loaded. A second call is a no-op."""
    global _module, _failure
    if _module is not None:
        return
    try:
        _module = _load_sealed(image)
    except (OSError, ImportError, AttributeError) as exc:
        try:
            _module = _load_private_file(image)
        except (OSError, ImportError) as again:
            _failure = f"cannot load the native timer: {exc}; from a private file: {again}"
            raise NativeTimerUnavailable(_failure) from None


def _import_from(path: str) -> Any:
    loader = importlib.machinery.ExtensionFileLoader(MODULE_NAME, path)
    spec = importlib.util.spec_from_file_location(MODULE_NAME, path, loader=loader)
    if spec is None:
        raise ImportError(f"no import spec for {path}")
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def _load_sealed(image: bytes) -> Any:
    import fcntl

    fd = os.memfd_create(MODULE_NAME, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        view = memoryview(image)
        while view:
            view = view[os.write(fd, view) :]
        seals = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
        return _import_from(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)  # the mapping stays; no fd is left for candidate code


def _load_private_file(image: bytes) -> Any:
    folder = tempfile.mkdtemp(prefix="krefine-native-")
    try:
        path = os.path.join(folder, f"{MODULE_NAME}.so")
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o500), "wb") as f:
            f.write(image)
        return _import_from(path)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def loaded() -> bool:
    return _module is not None


def require() -> None:
    """Raise NativeTimerUnavailable unless the native loop is loaded in this process."""
    if _module is None:
        why = f" ({_failure})" if _failure else ""
        raise NativeTimerUnavailable(
            f"strict mode's native timing loop is not loaded in this process{why}; strict mode does not "
            "time without it"
        )


def run(
    fn: Any, inputs: Any, after: Any, calls: int, discard: int, stream: int | None, flush: Any
) -> tuple[tuple[float, ...], tuple[int, str, str] | None]:
    """The native loop (kb_native_timer.cpp's `run`). Raises NativeTimerUnavailable when the module was
    not loaded into this process: strict mode has no Python fallback."""
    require()
    times, stop = _module.run(fn, inputs, after, calls, discard, stream, flush)
    return tuple(float(t) for t in times), stop
