"""The split build of C++ candidates (kb_split): reading the bound functions' signatures, the two units'
texts, and real builds: a split module behaves as the plain one, and a misread signature is caught by
the compiler and answered with the plain build."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import kb_bench
import kb_build
import kb_compile
import kb_split
from kb_split import Signature

SOURCE = r"""
#include <torch/extension.h>
#include <vector>
// torch::Tensor commented(torch::Tensor x);
using namespace torch;
static const char* kDoc = "torch::Tensor scale(int) {";
namespace helpers { torch::Tensor scale(torch::Tensor x, double s) { return x * s; } }
struct Acc { torch::Tensor t; torch::Tensor numel_twice(torch::Tensor x) { return x; } };

torch::Tensor scale(const torch::Tensor& x, double s = 2.0, bool inplace = false);

torch::Tensor scale(const torch::Tensor& x, double s, bool inplace) {
    return inplace ? x.mul_(s) : x * s;
}

std::vector<torch::Tensor> pieces(at::Tensor x, std::vector<int64_t> sizes,
                                  c10::optional<torch::Tensor> bias) {
    auto parts = x.split_with_sizes(sizes);
    return std::vector<torch::Tensor>(parts.begin(), parts.end());
}

void fill_value(Tensor& out, int64_t value) noexcept { out.fill_(value); }

#define TWICE(x) \
    (2 * (x))
int64_t
numel_twice(
    torch::Tensor x /* the input */) { return TWICE(x.numel()); }
"""


def test_signatures_are_read_from_global_declarations_only() -> None:
    read = kb_split.read_signatures(SOURCE, ["scale", "pieces", "fill_value", "numel_twice"])
    assert read == {
        "scale": Signature("scale", "::at::Tensor", ("const ::at::Tensor&", "double", "bool")),
        "pieces": Signature(
            "pieces",
            "::std::vector<::at::Tensor>",
            ("::at::Tensor", "::std::vector<::std::int64_t>", "::c10::optional<::at::Tensor>"),
        ),
        "fill_value": Signature("fill_value", "void", ("::at::Tensor&", "::std::int64_t"), noexcept=True),
        "numel_twice": Signature("numel_twice", "::std::int64_t", ("::at::Tensor",)),
    }
    assert read["fill_value"].pointer_type() == "void (*)(::at::Tensor&, ::std::int64_t) noexcept"
    assert read["scale"].declaration() == "::at::Tensor scale(const ::at::Tensor&, double, bool);"


@pytest.mark.parametrize(
    ("source", "why"),
    [
        ("torch::Tensor f(torch::Tensor x);\ntorch::Tensor f(torch::Tensor x, double s);", "more than one signature"),
        ("template <typename T> torch::Tensor f(torch::Tensor x) { return x; }", "specifier"),
        ("static torch::Tensor f(torch::Tensor x) { return x; }", "specifier"),
        ("inline torch::Tensor f(torch::Tensor x) { return x; }", "specifier"),
        ('extern "C" torch::Tensor f(torch::Tensor x) { return x; }', "specifier"),
        ("torch::Tensor f(float* p) { return {}; }", "parameter type"),
        ("MyTensor f(torch::Tensor x) { return {}; }", "return type"),
        ("namespace k { torch::Tensor f(torch::Tensor x) { return x; } }\nusing k::f;", "no declaration"),
        ("auto f = [](torch::Tensor x) { return x; };", "no declaration"),
        ("auto f(torch::Tensor x) -> torch::Tensor { return x; }", "specifier"),
        ("torch::Tensor f(torch::Tensor x) { return x; ", "unbalanced"),
    ],
)
def test_what_cannot_be_read_is_not_split(source: str, why: str) -> None:
    read = kb_split.read_signatures(source, ["f"])
    assert isinstance(read, str) and why in read, read


def test_which_calls_are_split(monkeypatch: pytest.MonkeyPatch) -> None:
    base: dict[str, Any] = {
        "cpp_sources": "torch::Tensor f(torch::Tensor x) { return x; }",
        "functions": ["f"],
        "cuda_sources": None,
        "sycl_sources": None,
        "no_implicit_headers": False,
        "use_pch": False,
        "is_python_module": True,
    }
    monkeypatch.setenv("KREFINE_SPLIT_CPP", "1")
    assert kb_split.split_reason(base) is None
    assert kb_split.split_reason({**base, "cuda_sources": "__global__ void k() {}"}) is not None
    assert kb_split.split_reason({**base, "functions": None}) == "no functions to bind"
    assert kb_split.split_reason({**base, "no_implicit_headers": True}) is not None
    uses_python = {**base, "cpp_sources": "py::object f(torch::Tensor x) { return py::none(); }"}
    assert kb_split.split_reason(uses_python) == "the candidate uses Python or pybind11 itself"
    older_torch = {k: v for k, v in base.items() if k != "no_implicit_headers"}
    assert kb_split.split_reason(older_torch) == "a torch without no_implicit_headers"
    monkeypatch.setenv("KREFINE_SPLIT_CPP", "0")
    assert kb_split.split_reason(base) == "turned off (KREFINE_SPLIT_CPP=0)"
    # Unset: split with enough cores for both units, one unit below that.
    monkeypatch.delenv("KREFINE_SPLIT_CPP")
    monkeypatch.setattr(kb_split, "usable_cores", lambda: kb_split.SPLIT_MIN_CORES)
    assert kb_split.split_reason(base) is None
    monkeypatch.setattr(kb_split, "usable_cores", lambda: 2)
    assert kb_split.split_reason(base) == "2 usable cores: the two units would share them (KREFINE_SPLIT_CPP=1 splits anyway)"


def test_the_two_units_texts() -> None:
    source = "#include <torch/extension.h>\ntorch::Tensor f(torch::Tensor x, double s = 1.0) { return x * s; }"
    out = kb_split.split_sources([source], {"f": "scales"}, True, "/p/a/krefine_pch.h", "/p/b/krefine_pch.h")
    assert isinstance(out, kb_split.SplitSources)
    assert out.candidate == (
        '#include "/p/a/krefine_pch.h"\n'
        "#include <torch/all.h>\n"
        "torch::Tensor f(torch::Tensor x, double s = 1.0) { return x * s; }\n"
        "#include <type_traits>\n"
        "static_assert(::std::is_same<decltype(&::f), ::at::Tensor (*)(::at::Tensor, double)>::value, "
        '"krefine: the split build misread the signature of f");\n'
    )
    # The module exactly as load_inline writes it.
    assert out.bindings == (
        '#include "/p/b/krefine_pch.h"\n'
        "::at::Tensor f(::at::Tensor, double);\n"
        "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {\n"
        'm.def("f", torch::wrap_pybind_function(f), "scales");\n'
        "}\n"
    )
    bare = kb_split.split_sources([source], {"f": "f"}, False, "a.h", "b.h")
    assert isinstance(bare, kb_split.SplitSources) and 'm.def("f", f, "f");' in bare.bindings


def test_a_split_record_is_replayed_as_one() -> None:
    record = kb_build.ExtensionBuild("e", kb_build.FAST, pch="/a.h", split=True, bindings_pch="/b.h").to_json()
    assert kb_build.ExtensionBuild.from_json(record) == kb_build.ExtensionBuild(
        "e", kb_build.FAST, pch="/a.h", split=True, bindings_pch="/b.h"
    )
    # A record that says split without both headers replays as an unsplit build.
    broken = kb_build.ExtensionBuild.from_json({**record, "bindings_pch": None})
    assert broken is not None and broken.split is False


# ------------------------------------------------------------------------------------------ real builds

EQUIVALENT = '''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = r"""SOURCE"""

ext = load_inline(
    name="NAME",
    cpp_sources=source,
    functions={"scale": "scales a tensor", "pieces": "pieces", "fill_value": "fill_value", "numel_twice": "numel_twice"},
)


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.scale(x, 2.0, False)
'''


def _load(source: str, build: Path, log: Path, mode: str) -> kb_compile.LoadResult:
    result = kb_compile.load_candidate(source, str(build), str(log), record=True, build_mode=mode)
    assert result.ok, result.feedback
    return result


@pytest.mark.slow
def test_a_split_module_behaves_as_the_plain_one(compiled: dict[str, dict[str, Any]], work: Path) -> None:
    """The same candidate built plain and split (with the session's headers): same docstrings, same
    results, same errors for arguments of the wrong type."""
    import torch

    modules = {}
    for mode in (kb_build.PLAIN, kb_build.FAST):
        name = f"krefine_split_{mode}"
        # torch's wrap_pybind_function cannot take a noexcept function, so neither build could.
        source = EQUIVALENT.replace("SOURCE", SOURCE.replace(" noexcept", "")).replace("NAME", name)
        result = _load(source, work / "build" / name, work / "logs" / f"{name}.log", mode)
        info = kb_compile.read_build_info(str(work / "build" / name))
        assert [e["split"] for e in info["extensions"]] == [mode == kb_build.FAST]
        modules[mode] = result.module.ext  # type: ignore[union-attr]
    plain, split = modules[kb_build.PLAIN], modules[kb_build.FAST]
    for fn in ("scale", "pieces", "fill_value", "numel_twice"):
        assert getattr(split, fn).__doc__ == getattr(plain, fn).__doc__
    x = torch.arange(6.0)
    assert torch.equal(split.scale(x, 2.0, False), plain.scale(x, 2.0, False))
    assert torch.equal(split.scale(x, 2.0, False), x * 2)
    assert [p.tolist() for p in split.pieces(x, [2, 4], None)] == [[0.0, 1.0], [2.0, 3.0, 4.0, 5.0]]
    assert split.numel_twice(x) == plain.numel_twice(x) == 12
    out = torch.zeros(3)
    split.fill_value(out, 7)
    assert out.tolist() == [7.0, 7.0, 7.0]
    errors = []
    for module in (plain, split):
        with pytest.raises(TypeError) as caught:
            module.scale("not a tensor")
        errors.append(str(caught.value))
    assert errors[0] == errors[1] and "incompatible function arguments" in errors[0]


MISREAD = '''
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

ext = load_inline(
    name="krefine_split_misread",
    cpp_sources="namespace mine { using Tensor = double; }\\nusing mine::Tensor;\\nTensor twice(Tensor x) { return 2 * x; }",
    functions=["twice"],
)


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.twice(x)
'''


@pytest.mark.slow
def test_a_misread_signature_fails_to_compile_and_builds_plain(compiled: dict[str, dict[str, Any]], work: Path) -> None:
    """`Tensor` here is a double, not torch's: read as a tensor, the static_assert stops the split build,
    and the plain build (which binds a double) is the one used and recorded."""
    build = work / "build" / "split_misread"
    result = _load(MISREAD, build, work / "logs" / "split_misread.log", kb_build.FAST)
    assert result.build_path == "fallback:fast-build-failed"
    attempt = (build / "krefine_split_misread" / kb_build.FAST_ATTEMPT_LOG).read_text()
    assert "the split build misread the signature of twice" in attempt
    assert result.module.ext.twice(3.0) == 6.0  # type: ignore[union-attr]


def test_the_split_comparison_ignores_alignment_padding(tmp_path: Path) -> None:
    """`f` is padded to the next function in the plain object and is last (unpadded) in the candidate
    unit: the same code, so the same verdict; `g` really differs."""
    import shutil
    import subprocess

    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        pytest.skip("no C compiler")
    sources = {
        "plain": "int f(int x) { return x + 1; }\nint g(int x) { return x * 2; }\n",
        "main": "int f(int x) { return x + 1; }\n",
        "bind": "int g(int x) { return x * 3; }\n",
    }
    for name, text in sources.items():
        (tmp_path / f"{name}.c").write_text(text)
        subprocess.run([compiler, "-O2", "-c", str(tmp_path / f"{name}.c"), "-o", str(tmp_path / f"{name}.o")], check=True)
    verdict = kb_bench._compare_split([tmp_path / "plain.o"], tmp_path / "main.o", tmp_path / "bind.o")
    assert verdict == {"candidate functions": "identical", "other functions": "0 of 1 identical"}
