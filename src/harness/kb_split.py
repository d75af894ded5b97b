"""A C++ candidate's `main.cpp` as two translation units built at once (the fast build's split).

A `load_inline` C++ extension is one translation unit: `#include <torch/extension.h>`, the candidate's
code, then the pybind11 module. With a precompiled header the parsing is gone, but what is left of a
cold build is dominated by work the headers bring into every unit that includes them: torch's C++
frontend (`torch/all.h`) instantiates templates, and pybind11 (`torch/python.h`) emits its whole
dispatcher. Neither depends on the candidate. Split in two, each unit pays only its own share and the two
compile in parallel:

- `main.cpp`: the candidate's code under `torch/all.h` (its `#include <torch/extension.h>` narrowed to
  that), followed by one `static_assert` per bound function checking the signature read below;
- `krefine_bind.cpp`: `torch/python.h`, a declaration of each bound function, and the module exactly as
  `load_inline` writes it (`m.def("f", torch::wrap_pybind_function(f), "doc")`).

The second unit needs the functions' declarations, which `load_inline` does not have: `read_signature`
reads them from the source, only for plain global functions whose types are all spelled from a known
set (tensors, scalars, vectors, optionals, ...), each written out fully qualified. Anything else (an
overload, a template, `static`, a namespace, an unknown type, a candidate that uses Python itself) is not
split. The `static_assert`s make the compiler prove that what was read is the function's exact type; a
misreading is a compile error, which the fast build answers with the plain one. `torch/all.h` declares no
pybind11 caster (it does not include pybind11), so the bindings unit converts arguments exactly as the
single unit would.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

CANDIDATE_PCH_TEXT = "// krefine: the candidate unit of a split build\n#include <torch/all.h>\n"
BINDINGS_PCH_TEXT = "// krefine: the bindings unit of a split build\n#include <torch/python.h>\n"
BINDINGS_FILE = "krefine_bind.cpp"

EXTENSION_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*[<"]torch/extension\.h[>"][^\n]*$', re.MULTILINE)
_USES_PYTHON = re.compile(r"PYBIND11_|pybind11|\bpy::|torch/python\.h|Python\.h|torch::python|\bPyObject\b|\bTHP")

# The type names a signature may use, each with the spelling the bindings unit declares it with.
_NAMES = {
    "Tensor": "::at::Tensor",
    "at::Tensor": "::at::Tensor",
    "torch::Tensor": "::at::Tensor",
    "Scalar": "::c10::Scalar",
    "at::Scalar": "::c10::Scalar",
    "c10::Scalar": "::c10::Scalar",
    "torch::Scalar": "::c10::Scalar",
    "ScalarType": "::c10::ScalarType",
    "at::ScalarType": "::c10::ScalarType",
    "c10::ScalarType": "::c10::ScalarType",
    "torch::ScalarType": "::c10::ScalarType",
    "torch::Dtype": "::c10::ScalarType",
    "IntArrayRef": "::c10::IntArrayRef",
    "at::IntArrayRef": "::c10::IntArrayRef",
    "c10::IntArrayRef": "::c10::IntArrayRef",
    "torch::IntArrayRef": "::c10::IntArrayRef",
    "TensorList": "::at::TensorList",
    "at::TensorList": "::at::TensorList",
    "torch::TensorList": "::at::TensorList",
    "Device": "::c10::Device",
    "at::Device": "::c10::Device",
    "c10::Device": "::c10::Device",
    "torch::Device": "::c10::Device",
    "int64_t": "::std::int64_t",
    "std::int64_t": "::std::int64_t",
    "int32_t": "::std::int32_t",
    "std::int32_t": "::std::int32_t",
    "size_t": "::std::size_t",
    "std::size_t": "::std::size_t",
    "std::string": "::std::string",
    "string": "::std::string",
}
# Templates a signature may use, with how many arguments each takes (None: any number).
_TEMPLATES = {
    "std::vector": ("::std::vector", 1),
    "std::optional": ("::std::optional", 1),
    "c10::optional": ("::c10::optional", 1),
    "at::optional": ("::c10::optional", 1),
    "torch::optional": ("::c10::optional", 1),
    "std::tuple": ("::std::tuple", None),
    "std::pair": ("::std::pair", 2),
    "std::array": None,  # takes a number: not read
    # Unqualified, as after `using namespace std;` (the static_assert proves what they named).
    "vector": ("::std::vector", 1),
    "optional": ("::std::optional", 1),
    "tuple": ("::std::tuple", None),
    "pair": ("::std::pair", 2),
}
_BUILTIN = {"void", "bool", "char", "short", "int", "long", "float", "double", "signed", "unsigned"}
# A function a second unit can call by name: none of these in front of it.
_SPECIFIERS = {
    "static", "inline", "constexpr", "consteval", "extern", "template", "friend", "virtual", "auto",
    "decltype", "typename", "operator", "__attribute__", "__inline", "__forceinline", "thread_local", "using",
}

_OPEN, _CLOSE = ("(", "[", "{"), (")", "]", "}")
_TOKEN = re.compile(r"[A-Za-z_]\w*|::|->|\.\.\.|&&|\d[\w.']*|\S")


def _strip(source: str) -> list[str]:
    """The source's tokens with comments, literals and preprocessor lines gone (a `#` line becomes the
    token `#`, a boundary no declaration crosses)."""
    out: list[str] = []
    i, n = 0, len(source)
    line_start = True
    chunk: list[str] = []

    def flush() -> None:
        if chunk:
            out.extend(_TOKEN.findall("".join(chunk)))
            chunk.clear()

    while i < n:
        c = source[i]
        if line_start and c in " \t":
            chunk.append(c)
            i += 1
            continue
        if line_start and c == "#":
            flush()
            while i < n:  # to the end of the directive, with its continuation lines
                j = source.find("\n", i)
                j = n if j < 0 else j
                if j > i and source[j - 1] == "\\":
                    i = j + 1
                    continue
                i = j
                break
            out.append("#")
            continue
        line_start = c == "\n"
        if source.startswith("//", i):
            j = source.find("\n", i)
            i = n if j < 0 else j
            continue
        if source.startswith("/*", i):
            j = source.find("*/", i + 2)
            i = n if j < 0 else j + 2
            chunk.append(" ")
            continue
        raw = re.match(r'(?:u8|[uUL])?R"([^()\\ ]{0,16})\(', source[i:])
        if raw:
            end = source.find(f"){raw.group(1)}\"", i + raw.end())
            i = n if end < 0 else end + len(raw.group(1)) + 2
            chunk.append(' "" ')
            continue
        if c in "\"'":
            j = i + 1
            while j < n and source[j] != c:
                j += 2 if source[j] == "\\" else 1
            i = j + 1
            chunk.append(' "" ' if c == '"' else " 0 ")
            continue
        chunk.append(c)
        i += 1
    flush()
    return out


@dataclass(frozen=True)
class Signature:
    name: str
    result: str
    params: tuple[str, ...]
    noexcept: bool = False

    def declaration(self) -> str:
        return f"{self.result} {self.name}({', '.join(self.params)}){' noexcept' if self.noexcept else ''};"

    def pointer_type(self) -> str:
        return f"{self.result} (*)({', '.join(self.params)}){' noexcept' if self.noexcept else ''}"


class _Types:
    """Reads one type from a token list at `pos`; `type_` returns its qualified spelling or None."""

    def __init__(self, tokens: list[str], pos: int) -> None:
        self.t = tokens
        self.pos = pos

    def peek(self, k: int = 0) -> str:
        i = self.pos + k
        return self.t[i] if i < len(self.t) else ""

    def qualified(self) -> str | None:
        parts: list[str] = []
        if self.peek() == "::":
            self.pos += 1
        while re.fullmatch(r"[A-Za-z_]\w*", self.peek()):
            parts.append(self.peek())
            self.pos += 1
            if self.peek() == "::" and re.fullmatch(r"[A-Za-z_]\w*", self.peek(1)):
                self.pos += 1
                continue
            break
        return "::".join(parts) if parts else None

    def type_(self) -> str | None:
        const = False
        while self.peek() == "const":
            const, self.pos = True, self.pos + 1
        if self.peek() in _BUILTIN:
            words = []
            while self.peek() in _BUILTIN:
                words.append(self.peek())
                self.pos += 1
            base = " ".join(words)
        else:
            name = self.qualified()
            if name is None:
                return None
            if name in _TEMPLATES:
                template = _TEMPLATES[name]
                if template is None or self.peek() != "<":
                    return None
                spelled, arity = template
                self.pos += 1
                args: list[str] = []
                while True:
                    arg = self.type_()
                    if arg is None:
                        return None
                    args.append(arg)
                    if self.peek() == ",":
                        self.pos += 1
                        continue
                    if self.peek() == ">":
                        self.pos += 1
                        break
                    return None
                if arity is not None and len(args) != arity:
                    return None
                base = f"{spelled}<{', '.join(args)}>"
            elif name in _NAMES:
                base = _NAMES[name]
            else:
                return None
        while self.peek() == "const":
            const, self.pos = True, self.pos + 1
        ref = ""
        if self.peek() in ("&", "&&"):
            ref = self.peek()
            self.pos += 1
        if self.peek() in ("*", "&", "&&", "[", "volatile"):
            return None
        return f"{'const ' if const else ''}{base}{ref}"


def _parameters(tokens: list[str]) -> tuple[str, ...] | None:
    """The parameter types of a parameter list's tokens (names and default values dropped)."""
    if not tokens or tokens == ["void"]:
        return ()
    params: list[str] = []
    reader = _Types(tokens, 0)
    while True:
        spelled = reader.type_()
        if spelled is None:
            return None
        if re.fullmatch(r"[A-Za-z_]\w*", reader.peek()):
            reader.pos += 1  # the parameter's name
        if reader.peek() == "=":  # a default value: up to the next comma outside brackets
            depth = 0
            reader.pos += 1
            while reader.pos < len(tokens):
                tok = tokens[reader.pos]
                if tok in ("(", "[", "{", "<"):
                    depth += 1
                elif tok in (")", "]", "}", ">"):
                    depth -= 1
                elif tok == "," and depth == 0:
                    break
                reader.pos += 1
        params.append(spelled)
        if reader.pos >= len(tokens):
            return tuple(params)
        if reader.peek() != ",":
            return None
        reader.pos += 1


def read_signatures(source: str, names: list[str]) -> dict[str, Signature] | str:
    """Each named function's signature, read from its declarations at global scope; or why not."""
    tokens = _strip(source)
    found: dict[str, set[Signature]] = {name: set() for name in names}
    depth = 0
    boundary = -1  # the last token no declaration reaches back over
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok in _OPEN:
            if depth == 0 and tok == "(" and i > 0 and tokens[i - 1] in found and (i < 2 or tokens[i - 2] != "::"):
                read = _declaration(tokens, boundary + 1, i)
                if isinstance(read, str):
                    return read
                if read is not None:
                    signature, end = read
                    found[signature.name].add(signature)
                    i, boundary = end, end - 1
                    continue
            depth += 1
        elif tok in _CLOSE:
            depth -= 1
            if depth < 0:
                return "unbalanced brackets"
            if depth == 0 and tok == "}":
                boundary = i
        elif depth == 0 and tok in (";", "#"):
            boundary = i
        i += 1
    out: dict[str, Signature] = {}
    for name, signatures in found.items():
        if not signatures:
            return f"no declaration of '{name}' at global scope"
        if len(signatures) > 1:
            return f"'{name}' is declared with more than one signature"
        out[name] = next(iter(signatures))
    return out


def _declaration(tokens: list[str], start: int, open_at: int) -> tuple[Signature, int] | str | None:
    """The function declared by `tokens[start:open_at]` (return type and name) and the parameter list
    opening at `open_at`, and the index of its `{` or `;`; None for a use of the name that is no
    declaration (a call in an initialiser, say); a reason when it is a declaration that cannot be split."""
    name = tokens[open_at - 1]
    prefix = tokens[start : open_at - 1]
    if any(t in _SPECIFIERS or t.startswith("__") or t == "[" for t in prefix):
        return f"'{name}' is declared with a specifier a second unit cannot follow"
    depth, close = 0, open_at
    for close in range(open_at, len(tokens)):
        if tokens[close] in _OPEN:
            depth += 1
        elif tokens[close] in _CLOSE:
            depth -= 1
            if depth == 0:
                break
    else:
        return "unbalanced brackets"
    end = close + 1
    noexcept = end < len(tokens) and tokens[end] == "noexcept"
    if noexcept:
        end += 1
    if end >= len(tokens) or tokens[end] not in ("{", ";"):
        return None if "=" in prefix else f"'{name}' has a declarator a second unit cannot follow"
    reader = _Types(prefix, 0)
    result = reader.type_()
    if result is None or reader.pos != len(prefix):
        return None if "=" in prefix else f"the return type of '{name}' is not one krefine reads"
    params = _parameters(tokens[open_at + 1 : close])
    if params is None:
        return f"a parameter type of '{name}' is not one krefine reads"
    if tokens[end] == "{":  # skip the body
        depth = 0
        for j in range(end, len(tokens)):
            if tokens[j] == "{":
                depth += 1
            elif tokens[j] == "}":
                depth -= 1
                if depth == 0:
                    return Signature(name, result, params, noexcept), j + 1
        return "unbalanced brackets"
    return Signature(name, result, params, noexcept), end + 1


@dataclass
class SplitSources:
    """The two units' texts (the candidate unit goes through `load_inline` as `main.cpp`)."""

    candidate: str
    bindings: str


def functions_dict(functions: Any) -> dict[str, str] | None:
    """`load_inline`'s `functions` argument as {name: docstring}, as torch reads it."""
    if isinstance(functions, str):
        return {functions: functions}
    if isinstance(functions, list) and all(isinstance(f, str) for f in functions):
        return {f: f for f in functions}
    if isinstance(functions, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in functions.items()):
        return dict(functions)
    return None


# Below this many usable cores the two units of a build share a core (with each other and the other
# builds), and each unit repeats the template instantiations its precompiled header leaves out (GCC
# writes a PCH before the end-of-unit instantiations: about 3.5 s of CPU per unit for torch/all.h):
# one unit is then faster. Measured on a 2-core machine against plain load_inline, cold candidates,
# headers from the previous run: one unit 0.31-0.46x, split 0.33-0.60x (docs/benchmarks.md).
SPLIT_MIN_CORES = 4


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask), else the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def split_reason(a: dict[str, Any]) -> str | None:
    """Why a `load_inline` call (its bound arguments) is not split, or None when it can be tried.
    KREFINE_SPLIT_CPP=0 never splits, =1 splits whatever the cores; unset, it splits with at least
    SPLIT_MIN_CORES usable cores."""
    setting = os.environ.get("KREFINE_SPLIT_CPP")
    if setting == "0":
        return "turned off (KREFINE_SPLIT_CPP=0)"
    if setting != "1" and (cores := usable_cores()) < SPLIT_MIN_CORES:
        return f"{cores} usable cores: the two units would share them (KREFINE_SPLIT_CPP=1 splits anyway)"
    if "no_implicit_headers" not in a:
        return "a torch without no_implicit_headers"
    if a.get("cuda_sources") or a.get("sycl_sources") or a.get("no_implicit_headers") or a.get("use_pch"):
        return "not a C++-only extension with torch's implicit header"
    if not a.get("is_python_module", True) or functions_dict(a.get("functions")) is None:
        return "no functions to bind"
    sources = a.get("cpp_sources")
    sources = [sources] if isinstance(sources, str) else sources
    if not isinstance(sources, list) or not all(isinstance(s, str) for s in sources):
        return "cpp_sources is not text"
    if any(_USES_PYTHON.search(s) for s in sources):
        return "the candidate uses Python or pybind11 itself"
    return None


def split_sources(
    cpp_sources: list[str], functions: dict[str, str], error_handling: bool, candidate_pch: str, bindings_pch: str
) -> SplitSources | str:
    """The texts of the two units, or why this candidate is not split."""
    joined = "\n".join(cpp_sources)
    signatures = read_signatures(joined, list(functions))
    if isinstance(signatures, str):
        return signatures
    checks = [
        f'static_assert(::std::is_same<decltype(&::{s.name}), {s.pointer_type()}>::value, '
        f'"krefine: the split build misread the signature of {s.name}");'
        for s in signatures.values()
    ]
    candidate = "\n".join(
        [
            f'#include "{candidate_pch}"',
            EXTENSION_INCLUDE.sub("#include <torch/all.h>", joined),
            "#include <type_traits>",
            *checks,
            "",
        ]
    )
    # The module exactly as load_inline writes it.
    module = ["PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {"]
    for name, doc in functions.items():
        bound = f"torch::wrap_pybind_function({name})" if error_handling else name
        module.append(f'm.def("{name}", {bound}, "{doc}");')
    module.append("}")
    bindings = "\n".join(
        [f'#include "{bindings_pch}"', *(s.declaration() for s in signatures.values()), *module, ""]
    )
    return SplitSources(candidate, bindings)


def write_if_changed(path: str, text: str) -> None:
    """Write `text` unless the file already has it (as torch's `_maybe_write`: ninja goes by mtimes)."""
    with contextlib.suppress(OSError), open(path) as f:
        if f.read() == text:
            return
    with open(path, "w") as f:
        f.write(text)


@contextlib.contextmanager
def with_bindings_unit(text: str) -> Iterator[None]:
    """While `load_inline` builds the candidate unit as `main.cpp`, add the bindings unit next to it:
    `load_inline` hands its sources to `_jit_compile`, which gets this file as one more source."""
    from torch.utils import cpp_extension

    original = cpp_extension._jit_compile

    def jit_compile(name: Any, sources: Any, *args: Any, **kwargs: Any) -> Any:
        sources = list(sources)
        path = os.path.join(os.path.dirname(os.path.abspath(sources[0])), BINDINGS_FILE)
        write_if_changed(path, text)
        return original(name, [*sources, path], *args, **kwargs)

    cpp_extension._jit_compile = jit_compile
    try:
        yield
    finally:
        cpp_extension._jit_compile = original
