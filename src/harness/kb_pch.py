"""krefine's shared precompiled headers: built once per (compiler, torch, flags, header) by trusted
processes only, published by atomic rename, looked up by confined compile children.

Who may write the shared PCH folder: only trusted code. A candidate is built in a child confined to its
own build folder (krefine_harness.compile_in_child), where the PCH folder is read-only: were it
writable, one candidate could plant a header that every later build of the same flags includes. The
child only looks a PCH up (`lookup_pch`) and lists the ones it missed (kb_build.PCH_WANTED); the worker
that forked it, which runs no candidate code, then has them built in the background by a fresh process
(`BackgroundPch`) for the next candidates, only for flag sets that cannot pull candidate files into the
header (`trusted_pch_request`), and only of the headers named in `PCH_TEXTS`.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kb_cusplit
import kb_split

PCH_DIR_NAME = "pch"
PCH_HEADER = "krefine_pch.h"
PCH_TEXT = "// krefine: torch/extension.h, precompiled once per compiler, torch and flags\n#include <torch/extension.h>\n"
# The headers a trusted process precompiles on request, by name: a request names one, never a text.
PCH_TEXTS = {
    "extension": PCH_TEXT,
    "candidate": kb_split.CANDIDATE_PCH_TEXT,
    "bindings": kb_split.BINDINGS_PCH_TEXT,
    "cuda_host": kb_cusplit.CUDA_HOST_PCH_TEXT,
}
PCH_BUILD_TIMEOUT_S = 900.0
# Written by krefine into a PCH folder it published from a sandboxed compile worker's copy-on-write
# layer into the shared build cache (PCH_PUBLISHED_MARKER in build_store.rs): a build that uses such a
# header says it came from the shared cache, i.e. an earlier worker or run made it.
PUBLISHED_MARKER = "krefine-published.json"
# Candidate flags a trusted PCH build accepts: optimisation, standard, macros, warnings, -f/-m switches.
# Nothing that names a file or passes options on (-include, -I, -Wp,..., -fplugin=, @file, -specs=).
_SAFE_PCH_FLAG = re.compile(
    r"-(?:O(?:[0-3sgz]|fast)?|std=[\w+]+|[DU][A-Za-z_]\w*(?:=[\w.+-]*)?|g[0-3]?|w|pthread"
    r"|W(?:no-)?[a-z][a-z0-9-]*(?:=[0-9a-z]+)?"
    r"|f(?:no-)?(?:fast-math|unroll-loops|openmp|PIC|pic|strict-aliasing|math-errno|finite-math-only"
    r"|tree-vectorize|inline-functions|omit-frame-pointer|exceptions|rtti)"
    r"|f(?:fp-contract|visibility)=[a-z]+"
    r"|m(?:arch|tune)=[\w-]+|m(?:no-)?(?:avx[\w]*|sse[\w.]*|fma|f16c|bmi2?|popcnt))"
)


def pch_root_for(build_dir: str) -> Path:
    """Where the precompiled headers of a build cache live: next to the candidates' build dirs."""
    return Path(os.path.abspath(build_dir)).parent / PCH_DIR_NAME


def as_list(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return [str(v) for v in value]


def main_cpp_flags(extra_cflags: Any, extra_include_paths: Any, with_cuda: bool) -> list[str] | None:
    """The flags torch compiles `main.cpp` with, less `-DTORCH_EXTENSION_NAME=...` (no torch header
    reads it), taken from the ninja file torch itself writes; None when torch cannot tell us."""
    from torch.utils import cpp_extension

    with tempfile.TemporaryDirectory(prefix="krefine-flags-") as tmp:
        sources = [os.path.join(tmp, "main.cpp")] + ([os.path.join(tmp, "cuda.cu")] if with_cuda else [])
        try:
            with open(os.devnull, "w") as quiet, contextlib.redirect_stderr(quiet):
                cpp_extension._write_ninja_file_to_build_library(
                    path=os.path.join(tmp, "build.ninja"),
                    name="krefine_pch",
                    sources=sources,
                    extra_cflags=as_list(extra_cflags),
                    extra_cuda_cflags=[],
                    extra_sycl_cflags=[],
                    extra_ldflags=[],
                    extra_include_paths=as_list(extra_include_paths),
                    with_cuda=with_cuda,
                    with_sycl=False,
                    is_standalone=False,
                )
            text = Path(tmp, "build.ninja").read_text()
        except Exception:  # noqa: BLE001 - a torch whose private writer differs: no PCH, the build stays correct
            return None
    values = {}
    for line in text.splitlines():
        key, sep, value = line.partition(" = ")
        if sep and key in ("cflags", "post_cflags"):
            values[key] = shlex.split(value.replace("$$", "$"))
    if "cflags" not in values:
        return None
    flags = values["cflags"] + values.get("post_cflags", [])
    return [f for f in flags if not f.startswith("-DTORCH_EXTENSION_NAME=")]


_COMPILER_IDS: dict[str, str] = {}


def _compiler_id(compiler: str) -> str:
    if compiler not in _COMPILER_IDS:
        path = shutil.which(compiler) or compiler
        try:
            out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30, check=False).stdout
        except (OSError, subprocess.SubprocessError):
            out = ""
        _COMPILER_IDS[compiler] = f"{os.path.realpath(path)}\n{out}"
    return _COMPILER_IDS[compiler]


def pch_key(compiler: str, flags: list[str], text: str = PCH_TEXT) -> str:
    import torch

    parts = [_compiler_id(compiler), torch.__version__, os.path.dirname(torch.__file__), text, *flags]
    h = hashlib.sha256()
    for part in parts:
        h.update(len(part).to_bytes(8, "little"))
        h.update(part.encode())
    return h.hexdigest()[:20]


@dataclass
class PchResult:
    header: str | None
    built_s: float = 0.0
    error: str = ""
    # The header was published into the shared build cache (by an earlier worker or run).
    shared: bool = False


def _found(final: Path) -> PchResult:
    return PchResult(str(final / PCH_HEADER), shared=(final / PUBLISHED_MARKER).is_file())


def ensure_pch(root: Path, compiler: str, flags: list[str], text: str = PCH_TEXT) -> PchResult:
    """The precompiled header for (compiler, torch, flags, text), building it once if needed.

    One builder per key (an flock on `<key>.lock`; waiters then find it built); the header and its
    `.gch` are written into a temporary folder that is renamed to `<key>` when complete, so no build
    ever sees a half-written PCH. A failed build leaves `<key>.failed` and the fast path goes on
    without a PCH.
    """
    import time

    key = pch_key(compiler, flags, text)
    final = root / key
    header = final / PCH_HEADER
    if (final / (PCH_HEADER + ".gch")).is_file():
        return _found(final)
    root.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with open(root / f"{key}.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if (final / (PCH_HEADER + ".gch")).is_file():
                return _found(final)
            failed = root / f"{key}.failed"
            if failed.is_file():
                return PchResult(None, error=failed.read_text(errors="replace"))
            for stale in root.glob(f"{key}.tmp-*"):  # left by a builder that was killed
                shutil.rmtree(stale, ignore_errors=True)
            tmp = Path(tempfile.mkdtemp(prefix=f"{key}.tmp-", dir=root))
            (tmp / PCH_HEADER).write_text(text)
            cmd = [compiler, "-x", "c++-header", str(tmp / PCH_HEADER), "-o", str(tmp / (PCH_HEADER + ".gch")), *flags]
            try:
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=PCH_BUILD_TIMEOUT_S, check=False)
                error = "" if done.returncode == 0 else f"exit {done.returncode}: {done.stderr[-4000:]}"
            except (OSError, subprocess.SubprocessError) as exc:
                error = str(exc)
            if error:
                shutil.rmtree(tmp, ignore_errors=True)
                failed.write_text(f"{shlex.join(cmd)}\n{error}")
                return PchResult(None, error=error)
            (tmp / "flags.json").write_text(json.dumps({"compiler": compiler, "flags": flags}, indent=1))
            if text in (PCH_TEXT, kb_split.CANDIDATE_PCH_TEXT):
                _write_identifiers(tmp, compiler, flags)
            os.rename(tmp, final)
            return PchResult(str(header), built_s=time.perf_counter() - started)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


IDENTIFIERS = "identifiers.txt"


def _write_identifiers(folder: Path, compiler: str, flags: list[str]) -> None:
    """Every identifier `torch/extension.h` brings (its preprocessed text's words), one a line, next to
    the header of a fast build's unit that holds candidate code: whether a name a fast build's compiler
    did not find is one the plain build's headers declare (kb_cusplit.candidates_fault). Not written
    when the preprocessor fails (then every such error falls back to the plain build)."""
    source = folder / "krefine_identifiers.h"
    source.write_text(PCH_TEXT)
    try:
        done = subprocess.run(
            [compiler, "-E", "-P", "-x", "c++", str(source), *flags],
            capture_output=True,
            text=True,
            timeout=PCH_BUILD_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return
    finally:
        source.unlink(missing_ok=True)
    if done.returncode == 0:
        names = sorted(set(re.findall(r"[A-Za-z_]\w*", done.stdout)))
        (folder / IDENTIFIERS).write_text("\n".join(names) + "\n")


def identifiers_of(header: str | None) -> set[str] | None:
    """The identifiers of `torch/extension.h` kept next to a shared header (see `_write_identifiers`)."""
    if header is None:
        return None
    try:
        return set(Path(header).with_name(IDENTIFIERS).read_text().split())
    except OSError:
        return None


def lookup_pch(root: Path, compiler: str, flags: list[str], text: str = PCH_TEXT) -> PchResult:
    """The shared PCH for (compiler, torch, flags, text) if a trusted process has built it. No lock is
    needed: a PCH folder appears complete, by rename.

    The folder is listed before the key is looked up. A sandboxed compile worker sees the build cache
    through an overlay, and krefine publishes a header into the cache beneath it (build_store.rs,
    publish_pchs) while the worker runs: overlayfs keeps a lookup's miss, so a worker whose child once
    looked the key up before it was published never found it afterwards (on the GPU host, 47 of 64
    builds of a cold batch missed headers published 75 s and 118 s into the run). A listing of the
    folder, which only the cache beneath holds, is read afresh each time."""
    key = pch_key(compiler, flags, text)
    try:
        listed = key in os.listdir(root)
    except OSError:
        listed = False
    final = root / key
    if listed and (final / (PCH_HEADER + ".gch")).is_file():
        return _found(final)
    return PchResult(None, error="not built yet")


def trusted_pch_request(wanted: Any) -> tuple[list[str], bool, str] | str:
    """The (extra_cflags, with_cuda, header text) of a PCH a confined child asked for, or why a trusted
    process must not build it: flags that could make the header read a file a candidate controls."""
    if not isinstance(wanted, dict):
        return "malformed request"
    cflags, paths, with_cuda = wanted.get("extra_cflags"), wanted.get("extra_include_paths"), wanted.get("with_cuda")
    if not isinstance(cflags, list) or not all(isinstance(f, str) for f in cflags) or not isinstance(with_cuda, bool):
        return "malformed request"
    text = PCH_TEXTS.get(wanted.get("header", "extension"))
    if text is None:
        return "malformed request"
    if paths:
        return "extra include paths"
    unsafe = [f for f in cflags if not _SAFE_PCH_FLAG.fullmatch(f)]
    if unsafe:
        return f"flags a shared header must not take: {' '.join(unsafe)[:200]}"
    return cflags, with_cuda, text


def warm_requests() -> list[dict[str, Any]]:
    """The shared headers a CUDA candidate that passes `load_inline` no flags uses, in the form a compile
    child asks for them (kb_build): its `main.cpp`'s (`extension`; a `load_inline` with CUDA sources is
    never split into C++ units, kb_split.split_reason) and the CUDA split's host unit's (`cuda_host`).
    Where torch builds no CUDA, the first alone, for a C++ extension's `main.cpp`. What the orchestrator
    has a trusted worker make at a run's start (`warm_headers`), before its first candidates ask."""
    from torch.utils import cpp_extension

    cuda = cpp_extension.CUDA_HOME is not None
    wanted: list[dict[str, Any]] = [
        {"extra_cflags": [], "extra_include_paths": [], "with_cuda": cuda, "header": "extension"}
    ]
    if cuda:
        host = kb_cusplit.host_extra_cflags([], [])
        wanted.append({"extra_cflags": host, "extra_include_paths": [], "with_cuda": True, "header": "cuda_host"})
    return wanted


class BackgroundPch:
    """PCH builds a trusted worker starts between requests without waiting for them: each one a
    separate `kb_pch.py ensure-pch` process (no candidate code has run in it), which takes the
    per-key flock and publishes the header by rename exactly as `ensure_pch` does."""

    def __init__(self) -> None:
        self.jobs: dict[str, subprocess.Popen[bytes]] = {}

    def request(self, root: Path, wanted: Any) -> str | None:
        """Start building what a child asked for; what was started or refused, for the worker log."""
        accepted = trusted_pch_request(wanted)
        if isinstance(accepted, str):
            return f"no shared precompiled header for these flags: {accepted}"
        cflags, with_cuda, text = accepted
        from torch.utils import cpp_extension

        compiler = cpp_extension.get_cxx_compiler()
        if not pch_supported(compiler):
            return None
        flags = main_cpp_flags(cflags, None, with_cuda)
        if flags is None:
            return None
        return self.start(root, compiler, flags, text)

    def start(self, root: Path, compiler: str, flags: list[str], text: str = PCH_TEXT) -> str | None:
        self.poll()
        key = pch_key(compiler, flags, text)
        if key in self.jobs or (root / key / (PCH_HEADER + ".gch")).is_file() or (root / f"{key}.failed").is_file():
            return None
        spec = json.dumps({"root": str(root), "compiler": compiler, "flags": flags, "text": text})
        self.jobs[key] = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "ensure-pch", spec],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
        )
        return f"building the shared precompiled header {key} in the background"

    def poll(self) -> None:
        for key, process in list(self.jobs.items()):
            if process.poll() is not None:
                del self.jobs[key]

    def wait(self, timeout_s: float = PCH_BUILD_TIMEOUT_S) -> int:
        """Wait for the builds started, `timeout_s` in all; how many are still running."""
        import time

        deadline = time.monotonic() + timeout_s
        for process in self.jobs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
        self.poll()
        return len(self.jobs)

    def stop(self) -> None:
        for process in self.jobs.values():
            with contextlib.suppress(OSError):
                process.kill()
        self.wait(timeout_s=30)


def ensure_pch_main(spec: str) -> dict[str, Any]:
    value = json.loads(spec)
    result = ensure_pch(Path(value["root"]), value["compiler"], list(value["flags"]), text=value["text"])
    return {"header": result.header, "error": result.error[-2000:], "built_s": round(result.built_s, 3)}


def pch_supported(compiler: str) -> bool:
    from torch.utils import cpp_extension

    if not sys.platform.startswith("linux"):
        return False
    try:
        return bool(cpp_extension.check_compiler_is_gcc(compiler))
    except Exception:  # noqa: BLE001 - a compiler torch cannot identify gets no PCH
        return False


if __name__ == "__main__":
    # `kb_pch.py ensure-pch SPEC` (BackgroundPch): build one PCH, print the result as one JSON line.
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    if len(sys.argv) != 3 or sys.argv[1] != "ensure-pch":
        print("usage: kb_pch.py ensure-pch SPEC", file=sys.stderr)
        raise SystemExit(2)
    print(json.dumps(ensure_pch_main(sys.argv[2])), flush=True)
