"""A CUDA extension's `.cu` compiled as two units: its kernels by nvcc without torch, its host code by the
host compiler under a precompiled header (the fast build's CUDA split).

A candidate's `.cu` mixes three things: kernels (`__global__`, `__device__` code), host functions written
against torch (`torch::Tensor`, `AT_DISPATCH_...`, `at::cuda::getCurrentCUDAStream()`), and the launches
(`kernel<<<grid, block, smem, stream>>>(args)`) that join them. nvcc parses torch's headers three times
for it (its host and device front ends, then the host compiler on the host front end's output): on the
development machine 33 of the 34 CPU seconds of such a unit, the kernels about one. So the split makes:

- the **device unit** (`cuda.cu`, built by nvcc as before): the source with every host item blanked and
  torch's headers left out, each kernel followed by a launcher, `krefine_launch_<kernel>(grid, block,
  smem, stream, params...)`, a host function that launches it exactly as the source did; template
  launchers are instantiated explicitly for the template arguments the host unit used;
- the **host unit** (`krefine_host.cpp`, built by the host compiler): the source with the kernels and
  device code replaced by the launchers' declarations and each launch by a call to its launcher, under a
  precompiled header of the narrowed torch headers (`CUDA_HOST_PCH_TEXT`).

The kernels are compiled by the same nvcc with the same flags from the same text, so their machine code is
the same (`krefine bench compile --compare-code` compares the SASS function by function). Both units keep
the source's line numbers (`#line`), so a diagnostic names the line of `cuda.cu` the candidate wrote.
Anything this does not recognise (a launch it cannot read, a kernel in an anonymous namespace, host code
that needs nvcc: cub, thrust, extended lambdas, a kernel's address taken) is not split: `split_cuda` says
why before anything is compiled, and the build goes the unsplit fast way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

HOST_FILE = "krefine_host.cpp"
HOST_OBJECT = "krefine_host.o"
LAUNCHER_PREFIX = "krefine_launch_"
# The host unit's precompiled header: what load_inline puts before a `.cu` and what the fast build
# narrows `torch/extension.h` to (kb_build.NARROW_CUDA_HEADERS).
CUDA_HOST_PCH_TEXT = (
    "// krefine: the host unit of a split CUDA build\n"
    "#include <torch/types.h>\n#include <cuda.h>\n#include <cuda_runtime.h>\n"
    "#include <ATen/cuda/CUDAContext.h>\n#include <c10/cuda/CUDAGuard.h>\n"
)
# Headers the device unit leaves out (torch's and Python's) and the ones only device code includes.
_HOST_ONLY_INCLUDE = re.compile(r"^\s*#\s*include\s*[<\"](?:torch/|ATen/|c10/|pybind11/|Python\.h)")
_DEVICE_ONLY_INCLUDE = re.compile(
    r"^\s*#\s*include\s*[<\"](?:cub/|thrust/|cooperative_groups|mma\.h|cuda_pipeline|cuda/|cute/|cutlass/|"
    r"crt/|sm_\d|cuda_awbarrier)"
)
_EXTENSION_INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]torch/extension\.h[>"]')
# Host code that only nvcc compiles.
_NEEDS_NVCC = re.compile(r"\b(?:cub|thrust|cooperative_groups|nvcuda|cute|cutlass)::|__device__|__global__|\[\]\s*__")
_TORCH = re.compile(r"\b(?:torch|at|c10|pybind11|py)::|\b(?:AT|TORCH|C10)_[A-Z_]+\b|\bTensor\b|PYBIND11")
_DEVICE_WORDS = ("__device__", "__constant__", "__shared__", "__managed__")
# Types of torch the device unit can declare with a header of its own (for template arguments).
C10_TYPE_HEADERS = {
    "c10::Half": "c10/util/Half.h",
    "c10::BFloat16": "c10/util/BFloat16.h",
    "c10::complex": "c10/util/complex.h",
}


def host_extra_cflags(extra_cflags: list[str], extra_cuda_cflags: list[str]) -> list[str]:
    """The extra flags of the host unit: the candidate's C++ flags, the macros torch gives nvcc (its
    `-D` flags: they shape the CUDA headers' host code too), and what of the candidate's CUDA flags
    nvcc hands its host compiler (`-O`, `-D`, `-U`, `-Xcompiler`/`--compiler-options` values)."""
    from torch.utils import cpp_extension

    out = list(extra_cflags)
    out += [f for f in getattr(cpp_extension, "COMMON_NVCC_FLAGS", []) if f.startswith("-D")]
    flags = list(extra_cuda_cflags)
    i = 0
    while i < len(flags):
        f = flags[i]
        if f in ("-Xcompiler", "--compiler-options") and i + 1 < len(flags):
            out += [x for x in flags[i + 1].split(",") if x]
            i += 2
            continue
        for prefix in ("-Xcompiler=", "--compiler-options="):
            if f.startswith(prefix):
                out += [x for x in f[len(prefix) :].split(",") if x]
        if re.fullmatch(r"-O[0-3s]?|-[DU]\w+(=.*)?", f):
            out.append(f)
        i += 1
    return out


class _Skip(Exception):
    """This source is not split: the message says why."""


@dataclass
class _Tok:
    text: str
    start: int
    end: int


def _lex(src: str) -> list[_Tok]:
    """Tokens of C++ source with their offsets: identifiers, numbers, one-character punctuation (`::` as
    one), string and character literals whole; comments dropped; a preprocessor line is one `#` token."""
    toks: list[_Tok] = []
    i, n = 0, len(src)
    line_start = True
    while i < n:
        c = src[i]
        if c == "\n":
            line_start = True
            i += 1
            continue
        if c in " \t\r\f\v":
            i += 1
            continue
        if src.startswith("//", i):
            j = src.find("\n", i)
            i = n if j < 0 else j
            continue
        if src.startswith("/*", i):
            j = src.find("*/", i + 2)
            if j < 0:
                raise _Skip("an unterminated comment")
            i = j + 2
            continue
        if c == "#" and line_start:
            j = i
            while True:  # up to the end of the line, continuations included
                k = src.find("\n", j)
                if k < 0:
                    k = n
                    break
                if src[k - 1] == "\\" or (src[k - 1] == "\r" and src[k - 2] == "\\"):
                    j = k + 1
                    continue
                break
            toks.append(_Tok("#", i, k))
            i = k
            continue
        line_start = False
        if c == "R" and src.startswith('R"', i):
            m = re.match(r'R"([^()\\ ]{0,16})\(', src[i:])
            if m:
                close = ")" + m.group(1) + '"'
                j = src.find(close, i + m.end())
                if j < 0:
                    raise _Skip("an unterminated raw string")
                toks.append(_Tok("STR", i, j + len(close)))
                i = j + len(close)
                continue
        if c in "\"'":
            j = i + 1
            while j < n and src[j] != c:
                if src[j] == "\\":
                    j += 1
                if j < n and src[j] == "\n":
                    raise _Skip("an unterminated literal")
                j += 1
            toks.append(_Tok("STR", i, j + 1))
            i = j + 1
            continue
        m = re.match(r"[A-Za-z_]\w*|\d[\w.']*(?:[eEpP][+-]\d+)?", src[i:])
        if m:
            toks.append(_Tok(m.group(0), i, i + m.end()))
            i += m.end()
            continue
        if src.startswith("::", i):
            toks.append(_Tok("::", i, i + 2))
            i += 2
            continue
        toks.append(_Tok(c, i, i + 1))
        i += 1
    return toks


_OPEN = {"(": ")", "[": "]", "{": "}"}


def _match(toks: list[_Tok], i: int) -> int:
    """The index of the bracket closing the one at `i`."""
    depth = 0
    for j in range(i, len(toks)):
        t = toks[j].text
        if t in _OPEN:
            depth += 1
        elif t in (")", "]", "}"):
            depth -= 1
            if depth == 0:
                return j
    raise _Skip("unbalanced brackets")


def _split_commas(toks: list[_Tok]) -> list[list[_Tok]]:
    """Top-level comma-separated parts (brackets and angle brackets nest)."""
    parts: list[list[_Tok]] = [[]]
    depth = angle = 0
    for t in toks:
        if t.text in _OPEN:
            depth += 1
        elif t.text in (")", "]", "}"):
            depth -= 1
        elif t.text == "<" and depth == 0:
            angle += 1
        elif t.text == ">" and depth == 0 and angle > 0:
            angle -= 1
        if t.text == "," and depth == 0 and angle == 0:
            parts.append([])
        else:
            parts[-1].append(t)
    return parts if parts != [[]] else []


@dataclass
class _Item:
    kind: str  # "pp", "kernel", "device", "both", "both-static", "host", "open", "close"
    start: int  # offsets into the source
    end: int
    toks: list[_Tok] = field(default_factory=list)
    kernel: _Kernel | None = None


@dataclass
class _Kernel:
    name: str
    template: str  # the template parameter list's text, "" for none
    template_names: list[str]
    params: str  # the parameter list's text
    param_names: list[str]

    @property
    def launcher(self) -> str:
        return LAUNCHER_PREFIX + self.name

    def signature(self) -> str:
        head = f"template <{self.template}> " if self.template else ""
        params = f", {self.params}" if self.params.strip() else ""
        return f"{head}void {self.launcher}(dim3 krefine_grid, dim3 krefine_block, size_t krefine_smem, cudaStream_t krefine_stream{params})"

    def definition(self) -> str:
        targs = f"<{', '.join(self.template_names)}>" if self.template else ""
        args = ", ".join(self.param_names)
        return (
            f"{self.signature()} {{ {self.name}{targs}<<<krefine_grid, krefine_block, krefine_smem, krefine_stream>>>({args}); }}"
        )


def _one_line(src: str, toks: list[_Tok]) -> str:
    """Tokens' text on one line (comments dropped), so a launcher adds no line to its unit."""
    return " ".join(src[t.start : t.end] for t in toks)


def _last_identifier(toks: list[_Tok]) -> str | None:
    # A parameter's name: its last identifier before a default value or an array's brackets.
    for j, t in enumerate(toks):
        if t.text == "=":
            toks = toks[:j]
            break
    while toks and toks[-1].text == "]":
        toks = toks[: max(0, [t.text for t in toks].index("["))]
    if toks and re.fullmatch(r"[A-Za-z_]\w*", toks[-1].text) and len(toks) > 1:
        return toks[-1].text
    return None


def _kernel(src: str, toks: list[_Tok], scope_anonymous: bool) -> _Kernel:
    """Read a kernel's definition: its name, template parameters and parameters."""
    words = [t.text for t in toks]
    if scope_anonymous:
        raise _Skip("a kernel in an anonymous namespace")
    template, names = "", []
    if words[0] == "template":
        if len(words) < 2 or words[1] != "<":
            raise _Skip("a kernel template without parameters")
        depth, j = 0, 1
        for j in range(1, len(toks)):
            if words[j] == "<":
                depth += 1
            elif words[j] == ">":
                depth -= 1
                if depth == 0:
                    break
        inner = toks[2:j]
        if not inner:
            raise _Skip("a specialised kernel template")
        template = _one_line(src, inner)
        for part in _split_commas(inner):
            if any(t.text == "." for t in part):
                raise _Skip("a kernel template with a parameter pack")
            name = _last_identifier(part)
            if name is None:
                raise _Skip("a kernel template parameter without a name")
            names.append(name)
        toks, words = toks[j + 1 :], words[j + 1 :]
    if "operator" in words:
        raise _Skip("a kernel operator")
    open_at = words.index("(")
    name = words[open_at - 1]
    if not re.fullmatch(r"[A-Za-z_]\w*", name) or (open_at >= 2 and words[open_at - 2] == "::"):
        raise _Skip("a kernel whose name krefine does not read")
    close = _match(toks, open_at)
    inner = toks[open_at + 1 : close]
    params = _one_line(src, inner)
    param_names: list[str] = []
    if params.strip() and params.strip() != "void":
        for part in _split_commas(inner):
            pname = _last_identifier(part)
            if pname is None:
                raise _Skip(f"a parameter of kernel '{name}' without a name")
            param_names.append(pname)
    else:
        params = ""
    return _Kernel(name, template, names, params, param_names)


def _strip_template(words: list[str]) -> list[str]:
    """The words after a leading `template <...>`."""
    if words[:2] != ["template", "<"]:
        return words
    depth = 0
    for j, w in enumerate(words):
        if w == "<":
            depth += 1
        elif w == ">":
            depth -= 1
            if depth == 0:
                return words[j + 1 :]
    return []


def _is_function(head: list[str]) -> bool:
    """Whether the words before a `{` head a function definition."""
    w = _strip_template(head)
    if not w or w[0] in ("struct", "class", "union", "enum", "typedef", "using") or "=" in w:
        return False
    return "(" in w and w[-1] in (")", "const", "noexcept", "override", "final", "mutable")


def _launches(toks: list[_Tok]) -> bool:
    return any(
        toks[i].text == toks[i + 1].text == toks[i + 2].text == "<"
        and toks[i + 1].start == toks[i].end
        and toks[i + 2].start == toks[i + 1].end
        for i in range(len(toks) - 2)
    )


def _classify(src: str, toks: list[_Tok]) -> str:
    words = [t.text for t in toks]
    present = set(words)
    if "__global__" in present:
        return "kernel"
    if "__host__" in present and "__device__" in present:
        # Defined in both units: a function with external linkage would be defined twice at link, so
        # the host unit's copy is made `static` (host code of this file is all that calls it there).
        if "(" in present and not present & {"inline", "static", "template", "__forceinline__", "constexpr"}:
            return "both-static"
        return "both"
    if present & set(_DEVICE_WORDS):
        return "device"
    text = src[toks[0].start : toks[-1].end]
    if _TORCH.search(text) or _launches(toks):
        return "host"
    if toks[-1].text == "}" and _is_function(words[: words.index("{")] if "{" in words else words):
        return "both" if present & {"inline", "static", "template", "constexpr"} else "host"
    # Types, aliases, constants, declarations: both units may need them; a global variable with
    # external linkage is defined once, in the host unit.
    if "=" in present and not present & {"const", "constexpr", "static", "using", "typedef", "enum"}:
        return "host"
    return "both"


def _items(src: str, toks: list[_Tok]) -> list[_Item]:
    """The source's top-level items (namespaces opened into), in order."""
    items: list[_Item] = []
    anonymous: list[bool] = []  # the open namespaces, innermost last: anonymous or not
    i = 0
    n = len(toks)
    while i < n:
        t = toks[i]
        if t.text == "#":
            items.append(_Item("pp", t.start, t.end, [t]))
            i += 1
            continue
        if t.text == "}":
            if not anonymous:
                raise _Skip("unbalanced brackets")
            anonymous.pop()
            last = i + 1 if i + 1 < n and toks[i + 1].text == ";" else i
            items.append(_Item("close", t.start, toks[last].end))
            i = last + 1
            continue
        if t.text == ";":
            i += 1
            continue
        j = i
        end: int | None = None
        while j < n:
            w = toks[j].text
            if w == "#":
                raise _Skip("a preprocessor line inside a declaration")
            if w == ";":
                end = j
                break
            if w == "{":
                head = [x.text for x in toks[i:j]]
                if head[:1] == ["namespace"] or head[:2] == ["inline", "namespace"]:
                    anonymous.append(len(head) == (2 if head[0] == "inline" else 1))
                    items.append(_Item("open", t.start, toks[j].end))
                    break
                if head[:1] == ["extern"]:
                    raise _Skip('an extern "C" block')
                close = _match(toks, j)
                if _is_function(head):
                    end = close
                    break
                j = close + 1
                continue
            if w in _OPEN:
                j = _match(toks, j) + 1
                continue
            j += 1
        else:
            raise _Skip("a declaration without its end")
        if end is None:  # a namespace opened
            i = j + 1
            continue
        part = toks[i : end + 1]
        kind = _classify(src, part)
        item = _Item(kind, part[0].start, part[-1].end, part)
        if kind == "kernel" and part[-1].text == "}":
            item.kernel = _kernel(src, part, any(anonymous))
        items.append(item)
        i = end + 1
    if anonymous:
        raise _Skip("a namespace without its end")
    return items


@dataclass
class CudaSplit:
    """The two units' texts (the device unit without its explicit instantiations yet)."""

    device: str
    host: str
    kernels: list[str]
    templates: list[str]  # the launchers of template kernels: instantiated for what the host unit uses


def _blank(text: str) -> str:
    # Keep the newlines (and so every later line's number); drop everything else.
    return re.sub(r"[^\n]", " ", text)


def _rewrite_launches(src: str, toks: list[_Tok], kernels: dict[str, _Kernel]) -> str:
    """The host item's text with each launch `k<...><<<g, b, s, st>>>(args)` made a launcher call."""
    out: list[str] = []
    pos = toks[0].start
    i = 0
    n = len(toks)
    while i < n:
        if toks[i].text == "<" and i + 2 < n and toks[i + 1].text == "<" and toks[i + 2].text == "<" and toks[i + 1].start == toks[i].end and toks[i + 2].start == toks[i + 1].end:
            # The callee: a name, perhaps qualified, perhaps with template arguments.
            k = i - 1
            targs_start = None
            if toks[k].text == ">":
                depth = 0
                while k >= 0:
                    if toks[k].text == ">":
                        depth += 1
                    elif toks[k].text == "<":
                        depth -= 1
                        if depth == 0:
                            break
                    k -= 1
                targs_start = k
                k -= 1
            if k < 0 or toks[k].text not in kernels:
                raise _Skip("a launch of a kernel krefine does not know")
            name_tok = toks[k]
            # The configuration, up to `>>>` outside brackets.
            j = i + 3
            depth = 0
            while j + 2 < n:
                w = toks[j].text
                if w in _OPEN:
                    depth += 1
                elif w in (")", "]", "}"):
                    depth -= 1
                elif w == ">" and depth == 0 and toks[j + 1].text == ">" and toks[j + 2].text == ">" and toks[j + 1].start == toks[j].end and toks[j + 2].start == toks[j + 1].end:
                    break
                j += 1
            else:
                raise _Skip("a launch without its end")
            config = _split_commas(toks[i + 3 : j])
            if not 2 <= len(config) <= 4 or any(not c for c in config):
                raise _Skip("a launch configuration krefine does not read")
            after = j + 3
            if after >= n or toks[after].text != "(":
                raise _Skip("a launch without arguments")
            close = _match(toks, after)
            cfg = [src[c[0].start : c[-1].end] for c in config]
            while len(cfg) < 4:
                cfg.append("0")
            args = src[toks[after].start + 1 : toks[close].start]
            targs = src[toks[targs_start].start : toks[i - 1].end] if targs_start is not None else ""
            call = (
                f"{LAUNCHER_PREFIX}{name_tok.text}{targs}(dim3({cfg[0]}), dim3({cfg[1]}), {cfg[2]}, {cfg[3]}"
                + (f", {args}" if args.strip() else "")
                + ")"
            )
            out.append(src[pos : name_tok.start])
            out.append(call)
            span = src[name_tok.start : toks[close].end]
            out.append("\n" * span.count("\n"))
            pos = toks[close].end
            i = close + 1
            continue
        if toks[i].text in kernels and not (i > 0 and toks[i - 1].text in (".", "->")):
            # Its address, or a call to a kernel as a function: only launches are rewritten.
            nxt = toks[i + 1].text if i + 1 < n else ""
            if nxt != "<":
                raise _Skip(f"kernel '{toks[i].text}' used other than in a launch")
        i += 1
    out.append(src[pos : toks[-1].end])
    return "".join(out)


# load_inline writes three lines of headers before the candidate's CUDA sources.
FIRST_LINE = 4


def split_cuda(source: str, path: str) -> CudaSplit | str:
    """The device and host units of a `.cu` (`source`: the candidate's CUDA sources joined as
    `load_inline` joins them; `path`: the `.cu` both units' `#line` name, so diagnostics point at the
    lines of the `.cu` a plain build compiles), or why it is not split."""
    try:
        return _split(source, path)
    except _Skip as why:
        return str(why)
    except (ValueError, IndexError):
        return "a construct krefine does not read"


def _split(source: str, path: str) -> CudaSplit:
    toks = _lex(source)
    items = _items(source, toks)
    kernels = {it.kernel.name: it.kernel for it in items if it.kernel is not None}
    if not kernels:
        raise _Skip("no kernel defined")
    declared = [it for it in items if it.kind == "kernel" and it.kernel is None]
    if declared:
        raise _Skip("a kernel declared apart from its definition")
    if len(kernels) != sum(1 for it in items if it.kernel is not None):
        raise _Skip("two kernels of one name")
    device: list[str] = []
    host: list[str] = []
    pos = 0
    for it in items:
        gap = source[pos : it.start]
        device.append(gap)
        host.append(gap)
        text = source[it.start : it.end]
        if it.kind == "pp":
            device.append(_blank(text) if _HOST_ONLY_INCLUDE.match(text) else text)
            if _EXTENSION_INCLUDE.match(text):
                # What the fast build narrows it to; the precompiled header holds the rest.
                host.append("#include <torch/types.h>" + _blank(text)[len("#include <torch/types.h>") :])
            else:
                host.append(_blank(text) if _DEVICE_ONLY_INCLUDE.match(text) else text)
        elif it.kind in ("open", "close", "both"):
            device.append(text)
            host.append(text)
        elif it.kind == "both-static":
            device.append(text)
            host.append("static " + text)
        elif it.kind == "kernel":
            k = it.kernel
            assert k is not None
            # The launcher on the kernel's last line: its lines stay where they were.
            device.append(text + " " + k.definition() + ";")
            host.append(_blank(text) + " " + k.signature() + ";")
        elif it.kind == "device":
            device.append(text)
            host.append(_blank(text))
        else:  # host
            if _NEEDS_NVCC.search(text):
                raise _Skip("host code that needs nvcc (cub, thrust, device lambdas, ...)")
            device.append(_blank(text))
            host.append(_rewrite_launches(source, it.toks, kernels))
        pos = it.end
    device.append(source[pos:])
    host.append(source[pos:])
    line = f'#line {FIRST_LINE} "{path}"\n'
    return CudaSplit(
        device=line + "".join(device),
        host=line + "".join(host),
        kernels=sorted(kernels),
        templates=sorted(k.launcher for k in kernels.values() if k.template),
    )


def instantiations(undefined: list[str], templates: list[str]) -> tuple[list[str], list[str]] | str:
    """The explicit instantiations of template launchers the host unit left undefined (`nm -uC` lines),
    and the headers their template arguments need in the device unit; or why they cannot be written."""
    lines: list[str] = []
    headers: set[str] = set()
    for symbol in undefined:
        m = re.match(r"^void ((?:[\w:]+::)?(" + LAUNCHER_PREFIX + r"\w+))<(.*)>\((.*)\)$", symbol.strip())
        if not m:
            continue
        if m.group(2) not in templates:
            return f"an instantiation krefine cannot read: {symbol.strip()[:200]}"
        text = f"template void {m.group(1)}<{m.group(3)}>({m.group(4)});"
        for word in re.findall(r"\b(?:c10|at|torch)::\w+", text):
            name = word.replace("at::", "c10::").replace("torch::", "c10::")
            if name not in C10_TYPE_HEADERS:
                return f"a template argument the device unit cannot declare: {word}"
            headers.add(C10_TYPE_HEADERS[name])
        lines.append(text)
    return sorted(set(lines)), sorted(headers)


def device_unit(split: CudaSplit, instantiated: list[str], headers: list[str]) -> str:
    """The device unit's whole text: the headers template arguments need, load_inline's CUDA headers,
    the split text and the explicit instantiations."""
    head = [f"#include <{h}>" for h in headers] + ["#include <cuda.h>", "#include <cuda_runtime.h>"]
    return "\n".join([*head, split.device, *instantiated, ""])


def host_unit(split: CudaSplit, pch_header: str | None) -> str:
    """The host unit's whole text: the precompiled header (or its text), then the split text."""
    first = f'#include "{pch_header}"' if pch_header else CUDA_HOST_PCH_TEXT.rstrip("\n")
    return f"{first}\n{split.host}\n"


# Diagnostics the split (or the narrowed headers) can cause in a source that builds the plain way: a
# name or type a left-out header or the other unit declared, a launcher call, a missing instantiation.
_OURS = re.compile(
    r"not declared|undeclared|is undefined|undefined reference|has not been declared|is not a member|"
    r"does not name a|no member named|has no member|incomplete type|no template named|not a class or "
    r"namespace|must be a class or namespace|cannot open source file|No such file|multiple definition|"
    r"no instance of|no matching function|could not convert|cannot convert|expected a type specifier|"
    r"not a template|krefine_launch|krefine_pch|explicit instantiation|Traceback \(most recent call last\)|"
    r"kb_nvcc|is not a type|unknown type name|was not declared"
)
# A compiler's or linker's error (gcc, nvcc, ld); torch's own summary ("Error building extension") is not.
_ERROR_LINE = re.compile(r"\berror ?:|undefined reference|multiple definition|ld returned|cannot find -l")


# What krefine writes into a fast build: its headers, units, launchers and checks (an extension's or a
# folder's name may hold the word too).
_KREFINES = re.compile(r"krefine_(?:pch|bind|launch|host|identifiers)|krefine: ")
# A name a compiler did not find: gcc's and nvcc's words for it.
_MISSING_NAME = re.compile(
    r"'(\w+)' (?:was not declared|has not been declared|does not name a type|is not a member of)"
    r"|‘(\w+)’ (?:was not declared|has not been declared|does not name a type|is not a member of)"
    r'|identifier "(\w+)" is undefined|has no member "(\w+)"'
)


def _missing_name(error: str) -> str | None:
    m = _MISSING_NAME.search(error)
    return next((g for g in m.groups() if g), None) if m else None


def candidates_fault(
    output: str, rewritten: bool, known: set[str] | None = None, sources: str = ""
) -> bool:
    """Whether a failed fast build failed for a reason the plain build fails for too: it reports errors,
    and (where the fast build rewrote the source: narrowed headers, a split) none of them is one the
    rewriting can cause. A name the compiler did not find is the candidate's when the plain build's
    headers do not declare it either (`known`: every identifier of `torch/extension.h`) and the
    candidate's sources name it nowhere but where it failed (so no unit lost its declaration). Nothing
    reported as an error (a crash, a killed compiler): not the candidate's."""
    errors = [line for line in output.splitlines() if _ERROR_LINE.search(line) and "ninja: build stopped" not in line]
    errors = [e for e in errors if not e.lstrip().startswith("FAILED:")]
    if not errors:
        return False
    if "Traceback (most recent call last)" in output:
        return False
    if rewritten:
        for e in errors:
            if not _OURS.search(e):
                continue
            name = _missing_name(e)
            if name is None or known is None or name in known or name.startswith("krefine"):
                return False
            uses = len(re.findall(rf"\b{re.escape(name)}\b", sources))
            failed = sum(1 for x in errors if _missing_name(x) == name)
            if uses > failed:
                return False
    # An error in a unit or line krefine wrote (a precompiled header, the bindings unit, a launcher, a
    # split's signature check) is krefine's.
    return not any(_KREFINES.search(e) for e in errors)
