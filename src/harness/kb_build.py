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

- for CUDA sources kb_cusplit.py can read, the `.cu` split in two: the kernels (and a launcher for each)
  built by nvcc without torch's headers, the host code built by the host compiler first, under a
  precompiled header of the narrow headers (`KREFINE_SPLIT_CUDA=0` turns it off). The host object is
  linked in through `extra_ldflags`; the template launchers the host code used are instantiated in the
  device unit (recorded, so a replay writes the same `.cu`).

The shared headers, and who may build them, are kb_pch.py's; a C++ extension's split into two units is
kb_split.py's, a CUDA extension's kb_cusplit.py's.

A fast build that fails in the candidate's own code is not built again: its error is the candidate's
(`kb_cusplit.candidates_fault`: the compilers reported errors, none of a kind the fast build's rewriting
can cause, such as a name a left-out header declared). Any other error of the fast build falls back to
the candidate's original call (the fast attempt's output is moved out of the log into
`krefine-fast-attempt.log`, so the log and its feedback are the plain build's).
The compile step records the path each extension took in `krefine_build.json`; a later import of the
same build (the GPU worker's) applies the recorded path, so ninja finds the build up to date.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kb_cusplit
import kb_pch
import kb_split

FAST = "fast"
PLAIN = "plain"
BUILD_MODES = (FAST, PLAIN)
FAST_ATTEMPT_LOG = "krefine-fast-attempt.log"
NARROW_CUDA_HEADERS = (
    "#include <torch/types.h>",
    "#include <ATen/cuda/CUDAContext.h>",
    "#include <c10/cuda/CUDAGuard.h>",
)
# A CUDA file that declares bindings itself needs pybind11 and torch/python.h: leave it alone.
_NEEDS_PYTHON = re.compile(r"PYBIND11_|pybind11|\bpy::|torch/python\.h|Python\.h")
# False in a confined compile child: it may use the shared PCHs but not build them.
PCH_BUILDER = True
# The PCHs a confined child missed: {"extra_cflags", "with_cuda"} for its worker to build.
PCH_WANTED: list[dict[str, Any]] = []
# Called with each PCH the child misses, as it misses it (krefine_harness.compile_in_child tells its
# worker at once, which starts the header while the child builds without it).
PCH_MISSED: Callable[[dict[str, Any]], None] | None = None


def narrow_cuda_sources(sources: list[str]) -> list[str] | None:
    """The CUDA sources with `torch/extension.h` replaced by the narrow headers, or None when there is
    nothing to replace or a file needs the Python bindings."""
    if not any(kb_split.EXTENSION_INCLUDE.search(s) for s in sources):
        return None
    if any(_NEEDS_PYTHON.search(s) for s in sources):
        return None
    narrow = "\n".join(NARROW_CUDA_HEADERS)
    return [kb_split.EXTENSION_INCLUDE.sub(narrow, s) for s in sources]


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
    # A C++ extension built as two units at once (kb_split.py): `pch` is the candidate unit's header,
    # `bindings_pch` the bindings unit's.
    split: bool = False
    bindings_pch: str | None = None
    # A CUDA extension built as a device and a host unit (kb_cusplit.py): the host unit's header, and
    # what the device unit was given for the host unit's template launchers.
    cuda_split: bool = False
    host_pch: str | None = None
    # A shared header whose folder holds `torch/extension.h`'s identifiers: whether a name a failed fast
    # build missed is one the plain build would have had (not recorded: only a failing build reads it).
    index: str | None = None
    instantiated: list[str] = field(default_factory=list)
    device_headers: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "path": self.path,
            "pch": self.pch,
            "narrowed": self.narrowed,
            "why": self.why,
            "nvcc": self.nvcc,
            "split": self.split,
            "bindings_pch": self.bindings_pch,
            "cuda_split": self.cuda_split,
            "host_pch": self.host_pch,
            "instantiated": self.instantiated,
            "device_headers": self.device_headers,
        }

    @staticmethod
    def from_json(value: Any) -> ExtensionBuild | None:
        if not isinstance(value, dict) or not isinstance(value.get("name"), str):
            return None
        path, pch, why, nvcc = value.get("path"), value.get("pch"), value.get("why"), value.get("nvcc")
        bindings_pch = value.get("bindings_pch")
        split = value.get("split") is True and isinstance(pch, str) and isinstance(bindings_pch, str)

        def strings(key: str) -> list[str] | None:
            v = value.get(key)
            return [x for x in v if isinstance(x, str)] if isinstance(v, list) else None

        instantiated, device_headers = strings("instantiated"), strings("device_headers")
        cuda_split = value.get("cuda_split") is True and instantiated is not None and device_headers is not None
        return ExtensionBuild(
            name=value["name"],
            path=path if isinstance(path, str) else PLAIN,
            pch=pch if isinstance(pch, str) else None,
            narrowed=bool(value.get("narrowed")),
            why=why if isinstance(why, str) else "",
            nvcc=nvcc if isinstance(nvcc, str) else None,
            split=split,
            bindings_pch=bindings_pch if split else None,
            cuda_split=cuda_split,
            host_pch=value.get("host_pch") if cuda_split and isinstance(value.get("host_pch"), str) else None,
            instantiated=instantiated or [] if cuda_split else [],
            device_headers=device_headers or [] if cuda_split else [],
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


SPLIT_WAITS = "its precompiled headers are not built yet"


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
            replayed = recorded if recorded is not None and recorded.name == name else ExtensionBuild(name, PLAIN)
            self.ctx.builds.append(replayed)
            if replayed.path == FAST:
                # The header itself is not needed: a main.o built with the PCH lists only main.cpp in
                # its deps, so ninja finds it up to date even where this worker cannot see the PCH
                # folder (and writing into the build cache would taint a sandboxed worker's view).
                return self._build(a, replayed)
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
            with _output_to(attempt):
                module = self._build(a, plan)
        except (Exception, SystemExit) as exc:  # any failure of the fast build: the candidate's, or fall back
            said = f"{_read_text(attempt)}\n{exc}"
            rewritten = plan.narrowed or plan.split or plan.cuda_split
            sources = "\n".join(kb_pch.as_list(a.get("cpp_sources")) + kb_pch.as_list(a.get("cuda_sources")))
            known = kb_pch.identifiers_of(plan.index)
            if kb_cusplit.candidates_fault(said, rewritten, known, sources):
                # The plain build would fail the same way: its error is the candidate's, built once.
                print(
                    f"krefine: the fast build of extension '{name}' failed in the candidate's own code; "
                    "not building it again the plain way",
                    flush=True,
                )
                _pass_on(attempt)
                raise
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
            plan.nvcc, plan.split, plan.bindings_pch = None, False, None
            plan.cuda_split, plan.host_pch, plan.instantiated, plan.device_headers = False, None, [], []
            return self.original(**self._fresh(a))
        _pass_on(attempt)
        return module

    def _plan(self, a: dict[str, Any], name: str) -> ExtensionBuild | str:
        """The fast plan for this call, or why it builds the plain way."""
        if self.ctx.mode == PLAIN:
            return "mode"
        if a.get("use_pch") or a.get("no_implicit_headers") or a.get("sycl_sources"):
            return "options"
        cuda = kb_pch.as_list(a.get("cuda_sources"))
        narrowed = narrow_cuda_sources(cuda) is not None if cuda else False
        pch: kb_pch.PchResult | None = None
        not_split = kb_split.split_reason(a)
        from torch.utils import cpp_extension

        compiler = cpp_extension.get_cxx_compiler()
        if kb_pch.pch_supported(compiler):
            with_cuda = a.get("with_cuda")
            with_cuda = bool(cuda) if with_cuda is None else bool(with_cuda)
            flags = kb_pch.main_cpp_flags(a.get("extra_cflags"), a.get("extra_include_paths"), with_cuda)
            if flags is not None:
                if not_split is None:
                    split = self._split_plan(a, name, compiler, flags, with_cuda)
                    if isinstance(split, ExtensionBuild):
                        return split
                    not_split = split
                # A candidate that splits once its headers exist does not ask for this one.
                wanted = not_split != SPLIT_WAITS
                pch = self._shared_pch(a, compiler, flags, with_cuda, "extension", request=wanted)
                if pch.header is None:
                    print(f"krefine: no precompiled header for '{name}': {pch.error[-500:]}", flush=True)
                elif pch.shared:
                    print(f"krefine: precompiled header {Path(pch.header).parent.name} from the shared build cache", flush=True)
        nvcc = overlapped_nvcc() if cuda else None
        if not narrowed and nvcc is None and (pch is None or pch.header is None):
            return "nothing-to-speed-up"
        plan = ExtensionBuild(
            name=name,
            path=FAST,
            pch=pch.header if pch is not None else None,
            narrowed=narrowed,
            pch_built_s=pch.built_s if pch is not None else 0.0,
            nvcc=nvcc,
            why=f"not split: {not_split}" if not_split and not cuda else "",
            index=pch.header if pch is not None else None,
        )
        if cuda and narrowed and kb_pch.pch_supported(compiler):
            why = self._cuda_split_plan(a, plan, compiler)
            if why:
                plan.why = f"cuda not split: {why}"
        return plan

    def _cuda_split_plan(self, a: dict[str, Any], plan: ExtensionBuild, compiler: str) -> str:
        """Make `plan` a CUDA split (kb_cusplit.py) when the sources allow it; else say why not."""
        if os.environ.get("KREFINE_SPLIT_CUDA") == "0":
            return "turned off (KREFINE_SPLIT_CUDA=0)"
        if "no_implicit_headers" not in a:
            return "a torch without no_implicit_headers"
        if a.get("with_cuda") is False or not a.get("is_python_module", True):
            return "options"
        split = kb_cusplit.split_cuda("\n".join(kb_pch.as_list(a.get("cuda_sources"))), "cuda.cu")
        if isinstance(split, str):
            return split
        host = {**a, "extra_cflags": self._host_cflags(a)}
        flags = kb_pch.main_cpp_flags(host["extra_cflags"], a.get("extra_include_paths"), True)
        if flags is None:
            return "no host flags"
        header = self._shared_pch(host, compiler, flags, True, "cuda_host")
        plan.cuda_split = True
        plan.host_pch = header.header
        plan.pch_built_s += header.built_s
        return ""

    def _split_plan(
        self, a: dict[str, Any], name: str, compiler: str, flags: list[str], with_cuda: bool
    ) -> ExtensionBuild | str:
        """The split build of a C++ extension (kb_split.py), or why not."""
        readable = self._split_sources(a, ExtensionBuild(name, FAST, pch="", split=True, bindings_pch=""))
        if isinstance(readable, str):
            return readable
        headers = [self._shared_pch(a, compiler, flags, with_cuda, kind) for kind in ("candidate", "bindings")]
        if any(h.header is None for h in headers):
            return SPLIT_WAITS
        for h in headers:
            if h.shared and h.header is not None:
                print(f"krefine: precompiled header {Path(h.header).parent.name} from the shared build cache", flush=True)
        plan = ExtensionBuild(
            name=name,
            path=FAST,
            pch=headers[0].header,
            pch_built_s=sum(h.built_s for h in headers),
            split=True,
            bindings_pch=headers[1].header,
            index=headers[0].header,
        )
        return plan

    def _shared_pch(
        self, a: dict[str, Any], compiler: str, flags: list[str], with_cuda: bool, kind: str, request: bool = True
    ) -> kb_pch.PchResult:
        """A shared PCH of `PCH_TEXTS[kind]`: built here by a trusted builder (when `request`), otherwise
        looked up, and listed in `PCH_WANTED` for the worker when missing and `request`."""
        text = kb_pch.PCH_TEXTS[kind]
        try:
            if PCH_BUILDER and request:
                return kb_pch.ensure_pch(self.ctx.pch_root, compiler, flags, text)
            pch = kb_pch.lookup_pch(self.ctx.pch_root, compiler, flags, text)
        except OSError as exc:
            return kb_pch.PchResult(None, error=str(exc))
        if pch.header is None and request:
            wanted = {
                "extra_cflags": kb_pch.as_list(a.get("extra_cflags")),
                "extra_include_paths": kb_pch.as_list(a.get("extra_include_paths")),
                "with_cuda": with_cuda,
                "header": kind,
            }
            PCH_WANTED.append(wanted)
            if PCH_MISSED is not None:
                PCH_MISSED(wanted)
        return pch

    @staticmethod
    def _split_sources(a: dict[str, Any], plan: ExtensionBuild) -> kb_split.SplitSources | str:
        functions = kb_split.functions_dict(a.get("functions"))
        if functions is None or plan.pch is None or plan.bindings_pch is None:
            return "no functions to bind"
        return kb_split.split_sources(
            kb_pch.as_list(a.get("cpp_sources")),
            functions,
            a.get("with_pytorch_error_handling", True) is not False,
            plan.pch,
            plan.bindings_pch,
        )

    def _build(self, a: dict[str, Any], plan: ExtensionBuild) -> Any:
        """Call the real load_inline the way `plan` says."""
        out = self._fresh(a)
        if plan.split:
            sources = self._split_sources(a, plan)
            if isinstance(sources, str):
                raise RuntimeError(f"krefine: the split build of '{plan.name}' cannot be made: {sources}")
            # main.cpp is the candidate unit, whose first line includes its PCH; the bindings unit is
            # added to load_inline's sources (kb_split.with_bindings_unit).
            out["cpp_sources"] = [sources.candidate]
            out["no_implicit_headers"] = True
            out["functions"] = None
            out["extra_cflags"] = ["-Winvalid-pch", *kb_pch.as_list(a.get("extra_cflags"))]
            with kb_split.with_bindings_unit(sources.bindings):
                return self.original(**out)
        if plan.cuda_split:
            self._split_cuda(a, plan, out)
        elif plan.narrowed:
            narrowed = narrow_cuda_sources(kb_pch.as_list(a.get("cuda_sources")))
            if narrowed is not None:
                out["cuda_sources"] = narrowed
        if plan.pch:
            # First, so it is the first include of main.cpp, as a PCH must be.
            out["extra_cflags"] = ["-include", plan.pch, "-Winvalid-pch", *kb_pch.as_list(a.get("extra_cflags"))]
        with _nvcc_command(plan.nvcc):
            return self.original(**out)


    @staticmethod
    def _host_cflags(a: dict[str, Any]) -> list[str]:
        return kb_cusplit.host_extra_cflags(kb_pch.as_list(a.get("extra_cflags")), kb_pch.as_list(a.get("extra_cuda_cflags")))

    def _split_cuda(self, a: dict[str, Any], plan: ExtensionBuild, out: dict[str, Any]) -> None:
        """Build the host unit (unless replaying: its object is there) and point `out` at the device
        unit and the host object."""
        from torch.utils import cpp_extension

        name = plan.name
        build_dir = a.get("build_directory") or cpp_extension._get_build_directory(name, False)
        cu_path = os.path.join(build_dir, "cuda.cu")
        split = kb_cusplit.split_cuda("\n".join(kb_pch.as_list(a.get("cuda_sources"))), cu_path)
        if isinstance(split, str):
            raise RuntimeError(f"krefine: the CUDA split of '{name}' cannot be made: {split}")  # noqa: TRY004 - a build error, not a caller's type
        host_object = os.path.join(build_dir, kb_cusplit.HOST_OBJECT)
        if self.ctx.replay is None:
            flags = kb_pch.main_cpp_flags(self._host_cflags(a), a.get("extra_include_paths"), True)
            if flags is None:
                raise RuntimeError("krefine: the host unit's flags are unknown")
            host_path = os.path.join(build_dir, kb_cusplit.HOST_FILE)
            Path(build_dir).mkdir(parents=True, exist_ok=True)
            kb_split.write_if_changed(host_path, kb_cusplit.host_unit(split, plan.host_pch))
            compiler = cpp_extension.get_cxx_compiler()
            command = [compiler, *flags, f"-DTORCH_EXTENSION_NAME={name}", "-c", host_path, "-o", host_object]
            # As torch's ninja prints its commands: the compile log shows what ran.
            print(f"[krefine host unit] {shlex.join(command)}", flush=True)
            done = subprocess.run(command, cwd=build_dir, capture_output=True, text=True, check=False)
            sys.stdout.write(done.stdout + done.stderr)
            sys.stdout.flush()
            if done.returncode != 0:
                # torch's words for a failed build, so the error reads as a plain build's would.
                raise RuntimeError(f"Error building extension '{name}': {done.stdout}{done.stderr}")
            symbols = subprocess.run(["nm", "-uC", host_object], capture_output=True, text=True, check=False)
            undefined = [line.split(" U ", 1)[-1] for line in symbols.stdout.splitlines() if " U " in line]
            found = kb_cusplit.instantiations(undefined, split.templates)
            if isinstance(found, str):
                raise RuntimeError(f"krefine: the CUDA split of '{name}' cannot be made: {found}")
            plan.instantiated, plan.device_headers = found
        out["cuda_sources"] = [kb_cusplit.device_unit(split, plan.instantiated, plan.device_headers)]
        out["cpp_sources"] = ["#include <torch/extension.h>", *kb_pch.as_list(a.get("cpp_sources"))]
        out["no_implicit_headers"] = True
        out["extra_ldflags"] = [*kb_pch.as_list(a.get("extra_ldflags")), host_object]


def _read_text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


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
