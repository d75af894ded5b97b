"""The fast build of a candidate's `load_inline` extensions, with torch's plain build as the fallback.

While a candidate is imported, `torch.utils.cpp_extension.load_inline` is replaced by `FastLoadInline`,
which calls the real `load_inline` (same name, same build directory, same module loading) with:

- a krefine-owned precompiled header for `main.cpp` (`-include <pch dir>/krefine_pch.h`): the header is
  exactly `torch/extension.h`, which `main.cpp` includes first anyway, built once per (compiler, torch,
  flags) into a content-addressed folder that appears by atomic rename, so concurrent builds share it
  and never see a half-written one. GCC uses a precompiled header only when it is valid for the
  compile's flags and otherwise reads the header text, so the translation unit is the same either way.
- the candidate's CUDA sources with `#include <torch/extension.h>` replaced by the narrower headers a
  kernel file needs (`NARROW_CUDA_HEADERS`): nvcc then skips parsing torch's whole C++ API and the
  Python/pybind11 headers in three front ends.

Who may write the shared PCH folder: only trusted code. A candidate is built in a child confined to its
own build folder (krefine_harness.compile_in_child), where the PCH folder is read-only: were it
writable, one candidate could plant a header that every later build of the same flags includes. The
child only looks a PCH up (`lookup_pch`) and lists the ones it missed (`PCH_WANTED`); the worker that
forked it, which runs no candidate code, then has them built in the background by a fresh process
(`BackgroundPch`) for the next candidates, and only for flag sets that cannot pull candidate files
into the header (`trusted_pch_request`).

Any error of the fast build falls back to the candidate's original call (the fast attempt's output is
moved out of the log into `krefine-fast-attempt.log`, so the log and its feedback are the plain build's).
The compile step records the path each extension took in `krefine_build.json`; a later import of the
same build (the GPU worker's) applies the recorded path, so ninja finds the build up to date.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import inspect
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FAST = "fast"
PLAIN = "plain"
BUILD_MODES = (FAST, PLAIN)
PCH_DIR_NAME = "pch"
PCH_HEADER = "krefine_pch.h"
PCH_TEXT = "// krefine: torch/extension.h, precompiled once per compiler, torch and flags\n#include <torch/extension.h>\n"
FAST_ATTEMPT_LOG = "krefine-fast-attempt.log"
NARROW_CUDA_HEADERS = (
    "#include <torch/types.h>",
    "#include <ATen/cuda/CUDAContext.h>",
    "#include <c10/cuda/CUDAGuard.h>",
)
_EXTENSION_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*[<"]torch/extension\.h[>"][^\n]*$', re.MULTILINE)
# A CUDA file that declares bindings itself needs pybind11 and torch/python.h: leave it alone.
_NEEDS_PYTHON = re.compile(r"PYBIND11_|pybind11|\bpy::|torch/python\.h|Python\.h")
PCH_BUILD_TIMEOUT_S = 900.0
# False in a confined compile child: it may use the shared PCHs but not build them.
PCH_BUILDER = True
# The PCHs a confined child missed: {"extra_cflags", "with_cuda"} for its worker to build.
PCH_WANTED: list[dict[str, Any]] = []
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


def narrow_cuda_sources(sources: list[str]) -> list[str] | None:
    """The CUDA sources with `torch/extension.h` replaced by the narrow headers, or None when there is
    nothing to replace or a file needs the Python bindings."""
    if not any(_EXTENSION_INCLUDE.search(s) for s in sources):
        return None
    if any(_NEEDS_PYTHON.search(s) for s in sources):
        return None
    narrow = "\n".join(NARROW_CUDA_HEADERS)
    return [_EXTENSION_INCLUDE.sub(narrow, s) for s in sources]


# ------------------------------------------------------------------------------------------- the PCH


def _as_list(value: Any) -> list[str]:
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
                    extra_cflags=_as_list(extra_cflags),
                    extra_cuda_cflags=[],
                    extra_sycl_cflags=[],
                    extra_ldflags=[],
                    extra_include_paths=_as_list(extra_include_paths),
                    with_cuda=with_cuda,
                    with_sycl=False,
                    is_standalone=False,
                )
            text = Path(tmp, "build.ninja").read_text()
        except Exception:  # a torch whose private writer differs: no PCH, the build stays correct
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
            out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
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
        return PchResult(str(header))
    root.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with open(root / f"{key}.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if (final / (PCH_HEADER + ".gch")).is_file():
                return PchResult(str(header))
            failed = root / f"{key}.failed"
            if failed.is_file():
                return PchResult(None, error=failed.read_text(errors="replace"))
            for stale in root.glob(f"{key}.tmp-*"):  # left by a builder that was killed
                shutil.rmtree(stale, ignore_errors=True)
            tmp = Path(tempfile.mkdtemp(prefix=f"{key}.tmp-", dir=root))
            (tmp / PCH_HEADER).write_text(text)
            cmd = [compiler, "-x", "c++-header", str(tmp / PCH_HEADER), "-o", str(tmp / (PCH_HEADER + ".gch")), *flags]
            try:
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=PCH_BUILD_TIMEOUT_S)
                error = "" if done.returncode == 0 else f"exit {done.returncode}: {done.stderr[-4000:]}"
            except (OSError, subprocess.SubprocessError) as exc:
                error = str(exc)
            if error:
                shutil.rmtree(tmp, ignore_errors=True)
                failed.write_text(f"{shlex.join(cmd)}\n{error}")
                return PchResult(None, error=error)
            (tmp / "flags.json").write_text(json.dumps({"compiler": compiler, "flags": flags}, indent=1))
            os.rename(tmp, final)
            return PchResult(str(header), built_s=time.perf_counter() - started)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def lookup_pch(root: Path, compiler: str, flags: list[str], text: str = PCH_TEXT) -> PchResult:
    """The shared PCH for (compiler, torch, flags, text) if a trusted process has built it. No lock is
    needed: a PCH folder appears complete, by rename."""
    header = root / pch_key(compiler, flags, text) / PCH_HEADER
    if Path(str(header) + ".gch").is_file():
        return PchResult(str(header))
    return PchResult(None, error="not built yet; this worker builds it for the next candidates")


def trusted_pch_request(wanted: Any) -> tuple[list[str], bool] | str:
    """The (extra_cflags, with_cuda) of a PCH a confined child asked for, or why a trusted process
    must not build it: flags that could make the header read a file a candidate controls."""
    if not isinstance(wanted, dict):
        return "malformed request"
    cflags, paths, with_cuda = wanted.get("extra_cflags"), wanted.get("extra_include_paths"), wanted.get("with_cuda")
    if not isinstance(cflags, list) or not all(isinstance(f, str) for f in cflags) or not isinstance(with_cuda, bool):
        return "malformed request"
    if paths:
        return "extra include paths"
    unsafe = [f for f in cflags if not _SAFE_PCH_FLAG.fullmatch(f)]
    if unsafe:
        return f"flags a shared header must not take: {' '.join(unsafe)[:200]}"
    return cflags, with_cuda


class BackgroundPch:
    """PCH builds a trusted worker starts between requests without waiting for them: each one a
    separate `kb_build.py ensure-pch` process (no candidate code has run in it), which takes the
    per-key flock and publishes the header by rename exactly as `ensure_pch` does."""

    def __init__(self) -> None:
        self.jobs: dict[str, subprocess.Popen[bytes]] = {}

    def request(self, root: Path, wanted: Any) -> str | None:
        """Start building what a child asked for; what was started or refused, for the worker log."""
        accepted = trusted_pch_request(wanted)
        if isinstance(accepted, str):
            return f"no shared precompiled header for these flags: {accepted}"
        cflags, with_cuda = accepted
        from torch.utils import cpp_extension

        compiler = cpp_extension.get_cxx_compiler()
        if not _pch_supported(compiler):
            return None
        flags = main_cpp_flags(cflags, None, with_cuda)
        if flags is None:
            return None
        return self.start(root, compiler, flags)

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

    def wait(self, timeout_s: float = PCH_BUILD_TIMEOUT_S) -> None:
        for process in self.jobs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=timeout_s)
        self.poll()

    def stop(self) -> None:
        for process in self.jobs.values():
            with contextlib.suppress(OSError):
                process.kill()
        self.wait(timeout_s=30)


def _ensure_pch_main(spec: str) -> dict[str, Any]:
    value = json.loads(spec)
    result = ensure_pch(Path(value["root"]), value["compiler"], list(value["flags"]), text=value["text"])
    return {"header": result.header, "error": result.error[-2000:], "built_s": round(result.built_s, 3)}


def _pch_supported(compiler: str) -> bool:
    from torch.utils import cpp_extension

    if not sys.platform.startswith("linux"):
        return False
    try:
        return bool(cpp_extension.check_compiler_is_gcc(compiler))
    except Exception:
        return False


# ------------------------------------------------------------------------------ the load_inline wrapper


@dataclass
class ExtensionBuild:
    """How one `load_inline` call of a candidate was built (the record a later import replays)."""

    name: str
    path: str  # fast | plain | fallback
    pch: str | None = None
    narrowed: bool = False
    why: str = ""
    pch_built_s: float = 0.0
    # The `PYTORCH_NVCC` command the CUDA sources were built with (kb_nvcc.py), or None for nvcc itself.
    # A replay sets the same, so ninja finds the same command line and the build up to date.
    nvcc: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "path": self.path,
            "pch": self.pch,
            "narrowed": self.narrowed,
            "why": self.why,
            "nvcc": self.nvcc,
        }

    @staticmethod
    def from_json(value: Any) -> ExtensionBuild | None:
        if not isinstance(value, dict) or not isinstance(value.get("name"), str):
            return None
        path, pch, why, nvcc = value.get("path"), value.get("pch"), value.get("why"), value.get("nvcc")
        return ExtensionBuild(
            name=value["name"],
            path=path if isinstance(path, str) else PLAIN,
            pch=pch if isinstance(pch, str) else None,
            narrowed=bool(value.get("narrowed")),
            why=why if isinstance(why, str) else "",
            nvcc=nvcc if isinstance(nvcc, str) else None,
        )


@dataclass
class BuildContext:
    """One import of a candidate: the mode and, for a replay, what the compile step recorded."""

    mode: str
    pch_root: Path
    replay: list[ExtensionBuild] | None = None
    builds: list[ExtensionBuild] = field(default_factory=list)

    def build_path(self) -> str | None:
        """`fast` when every extension built the fast way, `fallback:<why>` when one fell back, `plain`
        otherwise; None when the candidate built no extension."""
        if not self.builds:
            return None
        for b in self.builds:
            if b.path == "fallback":
                return f"fallback:{b.why}"
        if all(b.path == FAST for b in self.builds):
            return FAST
        return PLAIN


class PchOnly(Exception):
    """Raised by the warm-up mode after the PCH of a candidate's first extension is ready."""


@contextlib.contextmanager
def _output_to(path: Path) -> Iterator[None]:
    """Send fds 1 and 2 (the captured compile log) to `path` for the duration."""
    sys.stdout.flush()
    sys.stderr.flush()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    saved_out, saved_err = os.dup(1), os.dup(2)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        yield
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os.dup2(saved_out, 1)
        os.dup2(saved_err, 2)
        for f in (saved_out, saved_err, fd):
            os.close(f)


def _pass_on(path: Path) -> None:
    """Copy a successful fast build's output into the compile log, where it belongs."""
    with contextlib.suppress(OSError):
        data = path.read_bytes()
        path.unlink()
        view = memoryview(data)
        while view:
            view = view[os.write(1, view) :]


class FastLoadInline:
    """Stands in for `load_inline` while a candidate is imported (see the module doc)."""

    def __init__(self, original: Callable[..., Any], ctx: BuildContext) -> None:
        self.original = original
        self.ctx = ctx
        self.signature = inspect.signature(original)
        # Looks like load_inline to code that inspects it (name, doc, signature via __wrapped__).
        functools.update_wrapper(self, original, updated=())

    def _arguments(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any] | None:
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError:
            return None
        bound.apply_defaults()
        return dict(bound.arguments)

    @staticmethod
    def _fresh(a: dict[str, Any]) -> dict[str, Any]:
        # load_inline appends to list arguments in place; every attempt gets its own copies.
        return {k: (list(v) if isinstance(v, list) else v) for k, v in a.items()}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        a = self._arguments(args, kwargs)
        if a is None:
            return self.original(*args, **kwargs)  # let torch raise its own TypeError
        index = len(self.ctx.builds)
        name = str(a.get("name"))
        if self.ctx.replay is not None:
            recorded = self.ctx.replay[index] if index < len(self.ctx.replay) else None
            plan = recorded if recorded is not None and recorded.name == name else ExtensionBuild(name, PLAIN)
            self.ctx.builds.append(plan)
            if plan.path == FAST:
                # The header itself is not needed: a main.o built with the PCH lists only main.cpp in
                # its deps, so ninja finds it up to date even where this worker cannot see the PCH
                # folder (and writing into the build cache would taint a sandboxed worker's view).
                with _nvcc_command(plan.nvcc):
                    return self.original(**self._apply(a, plan))
            return self.original(**self._fresh(a))
        plan = self._plan(a, name)
        if self.ctx.mode == "pch-only":
            raise PchOnly((plan.pch or "") if isinstance(plan, ExtensionBuild) else "")
        if isinstance(plan, str):
            self.ctx.builds.append(ExtensionBuild(name, PLAIN, why=plan))
            return self.original(**self._fresh(a))
        self.ctx.builds.append(plan)
        from torch.utils import cpp_extension

        versions = dict(cpp_extension.JIT_EXTENSION_VERSIONER.entries)
        build_directory = a.get("build_directory") or cpp_extension._get_build_directory(name, False)
        # The fast attempt writes its own log: if it fails, the compile log (and its feedback) must be
        # the plain build's alone.
        attempt = Path(build_directory, FAST_ATTEMPT_LOG)
        try:
            with _output_to(attempt), _nvcc_command(plan.nvcc):
                module = self.original(**self._apply(a, plan))
        except (Exception, SystemExit) as exc:
            cpp_extension.JIT_EXTENSION_VERSIONER.entries.clear()
            cpp_extension.JIT_EXTENSION_VERSIONER.entries.update(versions)
            with contextlib.suppress(OSError), open(attempt, "a") as f:
                f.write(f"\n{type(exc).__name__}: {exc}\n")  # torch puts the compiler output here
            print(
                f"krefine: the fast build of extension '{name}' failed ({type(exc).__name__}); "
                f"building it the plain way (the fast attempt's log is in {FAST_ATTEMPT_LOG})",
                flush=True,
            )
            plan.path, plan.pch, plan.narrowed, plan.why = "fallback", None, False, "fast-build-failed"
            plan.nvcc = None
            return self.original(**self._fresh(a))
        _pass_on(attempt)
        return module

    def _plan(self, a: dict[str, Any], name: str) -> ExtensionBuild | str:
        """The fast plan for this call, or why it builds the plain way."""
        if self.ctx.mode == PLAIN:
            return "mode"
        if a.get("use_pch") or a.get("no_implicit_headers") or a.get("sycl_sources"):
            return "options"
        cuda = _as_list(a.get("cuda_sources"))
        narrowed = narrow_cuda_sources(cuda) is not None if cuda else False
        pch: PchResult | None = None
        from torch.utils import cpp_extension

        compiler = cpp_extension.get_cxx_compiler()
        if _pch_supported(compiler):
            with_cuda = a.get("with_cuda")
            with_cuda = bool(cuda) if with_cuda is None else bool(with_cuda)
            flags = main_cpp_flags(a.get("extra_cflags"), a.get("extra_include_paths"), with_cuda)
            if flags is not None:
                try:
                    if PCH_BUILDER:
                        pch = ensure_pch(self.ctx.pch_root, compiler, flags)
                    else:
                        pch = lookup_pch(self.ctx.pch_root, compiler, flags)
                        if pch.header is None:
                            PCH_WANTED.append(
                                {
                                    "extra_cflags": _as_list(a.get("extra_cflags")),
                                    "extra_include_paths": _as_list(a.get("extra_include_paths")),
                                    "with_cuda": with_cuda,
                                }
                            )
                except OSError as exc:
                    pch = PchResult(None, error=str(exc))
                if pch.header is None:
                    print(f"krefine: no precompiled header for '{name}': {pch.error[-500:]}", flush=True)
        nvcc = overlapped_nvcc() if cuda else None
        if not narrowed and nvcc is None and (pch is None or pch.header is None):
            return "nothing-to-speed-up"
        return ExtensionBuild(
            name=name,
            path=FAST,
            pch=pch.header if pch is not None else None,
            narrowed=narrowed,
            pch_built_s=pch.built_s if pch is not None else 0.0,
            nvcc=nvcc,
        )

    def _apply(self, a: dict[str, Any], plan: ExtensionBuild) -> dict[str, Any]:
        out = self._fresh(a)
        if plan.narrowed:
            narrowed = narrow_cuda_sources(_as_list(a.get("cuda_sources")))
            if narrowed is not None:
                out["cuda_sources"] = narrowed
        if plan.pch:
            # First, so it is the first include of main.cpp, as a PCH must be.
            out["extra_cflags"] = ["-include", plan.pch, "-Winvalid-pch", *_as_list(a.get("extra_cflags"))]
        return out


def overlapped_nvcc() -> str | None:
    """The `PYTORCH_NVCC` command that runs nvcc's steps overlapped (kb_nvcc.py), or None where nvcc
    is not found, is not CUDA's (ROCm), or the user named their own (a ccache wrapper, say)."""
    if os.environ.get("PYTORCH_NVCC") is not None or os.environ.get("KREFINE_NVCC_OVERLAP") == "0":
        return None
    from torch.utils import cpp_extension

    if getattr(cpp_extension, "IS_HIP_EXTENSION", False) or cpp_extension.CUDA_HOME is None:
        return None
    real = os.path.join(cpp_extension.CUDA_HOME, "bin", "nvcc")
    if not os.access(real, os.X_OK):
        return None
    return shlex.join([sys.executable, str(Path(__file__).with_name("kb_nvcc.py")), real])


@contextlib.contextmanager
def _nvcc_command(command: str | None) -> Iterator[None]:
    """`PYTORCH_NVCC` set to `command` for one build (torch writes it into the ninja file as `nvcc`)."""
    if command is None:
        yield
        return
    saved = os.environ.get("PYTORCH_NVCC")
    os.environ["PYTORCH_NVCC"] = command
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("PYTORCH_NVCC", None)
        else:
            os.environ["PYTORCH_NVCC"] = saved


@contextlib.contextmanager
def patched_load_inline(ctx: BuildContext) -> Iterator[None]:
    """Replace `load_inline` (in torch.utils.cpp_extension) for the duration of a candidate's import."""
    from torch.utils import cpp_extension

    original = cpp_extension.load_inline
    while isinstance(original, FastLoadInline):  # never stack wrappers
        original = original.original
    cpp_extension.load_inline = FastLoadInline(original, ctx)
    try:
        yield
    finally:
        cpp_extension.load_inline = original


def read_replay(info: dict[str, Any]) -> list[ExtensionBuild]:
    """What the compile step recorded in krefine_build.json (an empty list: build everything plain)."""
    value = info.get("extensions")
    if not isinstance(value, list):
        return []
    out = []
    for item in value:
        b = ExtensionBuild.from_json(item)
        out.append(b if b is not None else ExtensionBuild("", PLAIN))
    return out


# ------------------------------------------------------------------ the driver of `krefine bench compile`


def _bench_build(args: Any) -> dict[str, Any]:
    import time

    import kb_compile

    import resource

    import torch.utils.cpp_extension  # noqa: F401 - a compile worker has torch imported already

    source = Path(args.source).read_text()
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    result = kb_compile.load_candidate(
        source, args.build_dir, args.log, args.arch, record=True, build_mode=args.mode
    )
    seconds = time.perf_counter() - started
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    info = kb_compile.read_build_info(args.build_dir)
    build_path = info.get("build_path")
    # How kb_nvcc built each CUDA object, where it did (see kb_nvcc.MARKER_SUFFIX).
    steps = sorted({m.read_text().strip() for m in Path(args.build_dir).rglob("*.nvcc-steps")})
    if build_path and steps:
        build_path = f"{build_path} [{', '.join(steps)}]"
    return {
        "ok": result.ok,
        "seconds": round(seconds, 3),
        # The compilers' CPU time: steadier than wall time on a busy machine.
        "cpu_seconds": round(cpu, 3),
        "build_path": build_path,
        "error": result.error,
    }


def _bench_pch(args: Any) -> dict[str, Any]:
    """Make the PCH a candidate's first extension needs (untimed warm-up), without building it."""
    import time

    import kb_compile

    started = time.perf_counter()
    result = kb_compile.load_candidate(
        Path(args.source).read_text(), args.build_dir, args.log, args.arch, record=True, build_mode="pch-only"
    )
    warmed = isinstance(result.exc, PchOnly)
    return {"ok": warmed, "pch": str(result.exc) if warmed else None, "seconds": round(time.perf_counter() - started, 3)}


def _disassemble(obj: Path) -> str | None:
    """Machine code of an object: SASS for a CUDA object (cuobjdump), x86 for a host one (objdump)."""
    if obj.name.endswith(".cuda.o"):
        tool = shutil.which("cuobjdump") or os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "cuobjdump")
        cmd = [tool, "-sass", str(obj)]
    else:
        cmd = ["objdump", "-d", "--no-show-raw-insn", "-C", str(obj)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    # File names differ between the two builds; the code must not.
    return "\n".join(line for line in done.stdout.splitlines() if str(obj.parent) not in line and "file format" not in line)


def _bench_compare(args: Any) -> dict[str, Any]:
    """Compare the machine code of two builds of one candidate, object by object."""
    a, b = Path(args.a), Path(args.b)
    names = sorted({p.relative_to(a).as_posix() for p in a.rglob("*.o")} | {p.relative_to(b).as_posix() for p in b.rglob("*.o")})
    objects: dict[str, str] = {}
    for rel in names:
        da = _disassemble(a / rel) if (a / rel).exists() else None
        db = _disassemble(b / rel) if (b / rel).exists() else None
        if da is None or db is None:
            objects[rel] = "unavailable"
        else:
            objects[rel] = "identical" if da == db else "different"
    return {"objects": objects}


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="kb_build.py")
    sub = parser.add_subparsers(dest="cmd", required=True)
    for cmd in ("build", "pch"):
        p = sub.add_parser(cmd)
        p.add_argument("--source", required=True)
        p.add_argument("--build-dir", required=True)
        p.add_argument("--log", required=True)
        p.add_argument("--arch", default=None)
        p.add_argument("--mode", choices=BUILD_MODES, default=FAST)
    p = sub.add_parser("compare")
    p.add_argument("a")
    p.add_argument("b")
    p = sub.add_parser("ensure-pch", help="build a shared PCH (JSON: root, compiler, flags, text)")
    p.add_argument("spec")
    args = parser.parse_args(argv)
    if args.cmd == "ensure-pch":
        print(json.dumps(_ensure_pch_main(args.spec)), flush=True)
        return 0
    handlers = {"build": _bench_build, "pch": _bench_pch, "compare": _bench_compare}
    print(json.dumps(handlers[args.cmd](args)), flush=True)
    return 0


if __name__ == "__main__":
    # Run as the module kb_compile imports, so both see one PchOnly class.
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import kb_build

    raise SystemExit(kb_build.main(sys.argv[1:]))
