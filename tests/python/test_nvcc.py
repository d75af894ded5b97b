"""kb_nvcc: nvcc's steps overlapped. Real nvcc (CUDA 13.0 from NVIDIA's wheels, installed by
scripts/setup-venv) compiles on a CPU-only machine, so these build real CUDA objects and compare them with
nvcc's own: the device code (the `.nv_fatbin` section) and the host code must be the same bytes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import kb_build
from harness_client import HARNESS_DIR

KB_NVCC = HARNESS_DIR / "kb_nvcc.py"
ARCH = ["-gencode=arch=compute_90,code=sm_90"]

KERNELS = r"""
#include <cstdio>
static __device__ float scale = 2.0f;
namespace { __global__ void anon(float* x) { x[threadIdx.x] *= scale; } }
template <typename T> __global__ void twice(T* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = x[i] * T(2);
}
void launch(float* x, double* y, int n) {
    twice<<<(n + 255) / 256, 256>>>(x, n);
    twice<<<(n + 255) / 256, 256>>>(y, n);
    anon<<<1, 1>>>(x);
}
"""

# The first external symbol differs between the host and the device pass, and so does the module id
# each front end derives from it: cicc must run again with cudafe++'s.
HOST_ONLY_FIRST = "#ifndef __CUDA_ARCH__\nint host_only_first() { return 1; }\n#endif\n" + KERNELS

SYNTAX_ERROR = "__global__ void broken(float* x) { x[0] = undefined_name; }\n"


def _nvcc() -> str:
    try:
        import nvidia
    except ImportError:
        pytest.skip("NVIDIA's nvcc wheels are not installed (scripts/setup-venv installs them)")
    for root in nvidia.__path__:
        candidate = Path(root, "cu13", "bin", "nvcc")
        if candidate.is_file():
            return str(candidate)
    pytest.skip("nvidia-cuda-nvcc is not installed (scripts/setup-venv installs it)")


@pytest.fixture(scope="module")
def nvcc() -> str:
    path = _nvcc()
    if shutil.which("objcopy") is None or shutil.which("objdump") is None:
        pytest.skip("binutils (objcopy, objdump) are needed to compare objects")
    return path


def _compile(tool: list[str], source: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    args = [*tool, *ARCH, "-Xcompiler", "-fPIC", "-O3", *extra, "-c", str(source), "-o", str(out)]
    env = {**os.environ, "KREFINE_NVCC_TRACE": "1"}
    return subprocess.run(args, capture_output=True, text=True, env=env, timeout=300, check=False)


def _overlapped(nvcc: str) -> list[str]:
    return [sys.executable, str(KB_NVCC), nvcc]


def _device_code(obj: Path) -> bytes:
    data = obj.with_suffix(".fatbin")
    subprocess.run(["objcopy", "-O", "binary", "--only-section=.nv_fatbin", str(obj), str(data)], check=True)
    return data.read_bytes()


def _host_code(obj: Path) -> str:
    text = subprocess.run(["objdump", "-d", str(obj)], capture_output=True, text=True, check=True).stdout
    return text.split("\n", 2)[2]  # past the line naming the file


def _same_objects(a: Path, b: Path) -> None:
    assert _device_code(a) and _device_code(a) == _device_code(b)
    assert _host_code(a) == _host_code(b)


@pytest.mark.parametrize("dependencies", ["-MD -MF", "--generate-dependencies-with-compile --dependency-output"])
def test_overlapped_steps_make_nvccs_object(nvcc: str, tmp_path: Path, dependencies: str) -> None:
    """torch's ninja rule asks for the dependency file with `-MD -MF` (older torch: the long form)."""
    source = tmp_path / "kernels.cu"
    source.write_text(KERNELS)
    deps = tmp_path / "ours.o.d"
    plain = _compile([nvcc], source, tmp_path / "nvcc.o")
    ours = _compile(_overlapped(nvcc), source, tmp_path / "ours.o", *dependencies.split(), str(deps))
    assert plain.returncode == 0, plain.stderr
    assert ours.returncode == 0, ours.stderr
    _same_objects(tmp_path / "nvcc.o", tmp_path / "ours.o")
    assert (tmp_path / "ours.o.nvcc-steps").read_text() == "overlapped\n"
    trace = ours.stderr
    # The two front ends overlapped: cicc's chain ended without waiting for cudafe++, and one cicc ran.
    assert trace.count("krefine-nvcc: cicc ended") == 1
    assert "module ids differ" not in trace
    # ninja's dependency file: the object, the source and headers; none of the private temporary files.
    text = deps.read_text()
    assert text.startswith(f"{tmp_path / 'ours.o'}:") and str(source) in text
    assert "cuda_runtime.h" in text and "krefine-nvcc-" not in text


def test_module_ids_that_differ_run_the_device_steps_again(nvcc: str, tmp_path: Path) -> None:
    source = tmp_path / "host_first.cu"
    source.write_text(HOST_ONLY_FIRST)
    plain = _compile([nvcc], source, tmp_path / "nvcc.o")
    ours = _compile(_overlapped(nvcc), source, tmp_path / "ours.o")
    assert plain.returncode == 0, plain.stderr
    assert ours.returncode == 0, ours.stderr
    assert "module ids differ" in ours.stderr
    assert ours.stderr.count("krefine-nvcc: cicc ended") == 2
    _same_objects(tmp_path / "nvcc.o", tmp_path / "ours.o")


def test_a_compile_error_fails_as_nvccs_does(nvcc: str, tmp_path: Path) -> None:
    source = tmp_path / "broken.cu"
    source.write_text(SYNTAX_ERROR)
    plain = _compile([nvcc], source, tmp_path / "nvcc.o")
    ours = _compile(_overlapped(nvcc), source, tmp_path / "ours.o")
    assert plain.returncode != 0 and ours.returncode == plain.returncode
    message = 'identifier "undefined_name" is undefined'
    assert message in plain.stderr and message in ours.stderr
    assert not (tmp_path / "ours.o").exists()
    leftovers = [p for p in Path(os.environ.get("TMPDIR", "/tmp")).glob("krefine-nvcc-*") if p.is_dir()]
    assert not any(str(tmp_path) in str(p) for p in leftovers)


def test_other_modes_run_nvcc_itself(nvcc: str, tmp_path: Path) -> None:
    version = subprocess.run([sys.executable, str(KB_NVCC), nvcc, "--version"], capture_output=True, text=True, check=False)
    assert version.returncode == 0 and "Cuda compilation tools" in version.stdout
    source = tmp_path / "kernels.cu"
    source.write_text(KERNELS)
    # -E (preprocess only) is not a compile this rearranges: nvcc's own output.
    ours = subprocess.run(
        [sys.executable, str(KB_NVCC), nvcc, *ARCH, "-E", str(source)], capture_output=True, text=True, check=False
    )
    theirs = subprocess.run([nvcc, *ARCH, "-E", str(source)], capture_output=True, text=True, check=False)
    assert ours.returncode == theirs.returncode == 0
    assert "krefine-nvcc" not in ours.stderr and "twice" in ours.stdout
    # A compile with options whose steps it does not know (-save-temps) is nvcc's own, and says so.
    kept = subprocess.run(
        [sys.executable, str(KB_NVCC), nvcc, *ARCH, "-save-temps", "-c", str(source), "-o", str(tmp_path / "k.o")],
        capture_output=True, text=True, cwd=tmp_path, check=False,
    )
    assert kept.returncode == 0, kept.stderr
    assert (tmp_path / "k.o.nvcc-steps").read_text() == "nvcc (options)\n"


def _shape(tmp: Path, cicc: str = "cicc") -> list[list[str]]:
    """nvcc's steps for one architecture, as its dry run lists them."""
    return [
        ["gcc", "-E", "-x", "c++", "a.cu", "-o", f"{tmp}/a.cpp1.ii"],
        ["gcc", "-E", "-x", "c++", "a.cu", "-o", f"{tmp}/a.cpp4.ii"],
        ["cudafe++", "--gen_c_file_name", f"{tmp}/a.cudafe1.cpp", "--gen_module_id_file",
         "--module_id_file_name", f"{tmp}/a.module_id", f"{tmp}/a.cpp4.ii"],
        [cicc, "--module_id_file_name", f"{tmp}/a.module_id", "--stub_file_name", f"{tmp}/a.stub.c",
         f"{tmp}/a.cpp1.ii", "-o", f"{tmp}/a.ptx"],
        ["ptxas", f"{tmp}/a.ptx", "-o", f"{tmp}/a.cubin"],
        ["fatbinary", f"--image3=kind=elf,sm=90,file={tmp}/a.cubin", f"--embedded-fatbin={tmp}/a.fatbin.c"],
        ["gcc", "-c", "-x", "c++", f"{tmp}/a.cudafe1.cpp", "-o", "a.o"],
    ]


def test_the_plan_overlaps_the_front_ends(tmp_path: Path) -> None:
    import kb_nvcc

    plan = kb_nvcc.plan_steps(_shape(tmp_path), {}, "a.o", None)
    assert plan is not None
    kinds = [s.tool for s in plan.steps]
    assert kinds == ["host-preprocess", "host-preprocess", "cudafe++", "cicc", "ptxas", "fatbinary", "host-compile"]
    # cicc waits for its preprocessor only (not for cudafe++); the host compile for what it reads.
    assert plan.steps[3].after == {0} and plan.steps[2].after == {1}
    assert plan.steps[6].after >= {2, 3, 5}
    assert "--gen_module_id_file" in plan.steps[3].argv and plan.own_ids == [f"{tmp_path}/a.module_id.cicc0"]
    assert plan.nvcc_argv[3] == _shape(tmp_path)[3]  # nvcc's own, for when the ids differ
    # Shapes it does not know run the real nvcc: an unknown tool, a second host compile.
    assert kb_nvcc.plan_steps([["nvlink", "x"]], {}, "a.o", None) is None
    assert kb_nvcc.plan_steps([*_shape(tmp_path), _shape(tmp_path)[-1]], {}, "a.o", None) is None


def test_a_tool_that_cannot_start_fails_the_compile(tmp_path: Path, capfdbinary: pytest.CaptureFixture[bytes]) -> None:
    import kb_nvcc

    plan = kb_nvcc.plan_steps(_shape(tmp_path, cicc=str(tmp_path / "gone" / "cicc")), {}, "a.o", None)
    assert plan is not None
    for s in plan.steps:
        if s.tool != "cicc":
            s.argv = ["true"]
    assert kb_nvcc._Runner(plan, dict(os.environ)).run() == 2
    assert b"gone/cicc" in capfdbinary.readouterr().err


def test_kb_build_records_the_overlapped_nvcc_and_replays_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    record = kb_build.ExtensionBuild("ext", kb_build.FAST, nvcc="python kb_nvcc.py /cuda/bin/nvcc")
    again = kb_build.ExtensionBuild.from_json(record.to_json())
    assert again is not None and again.nvcc == record.nvcc
    old = kb_build.ExtensionBuild.from_json({"name": "ext", "path": "fast"})  # recorded before this field
    assert old is not None and old.nvcc is None
    monkeypatch.delenv("PYTORCH_NVCC", raising=False)
    with kb_build._nvcc_command(record.nvcc):
        assert os.environ["PYTORCH_NVCC"] == record.nvcc
    assert "PYTORCH_NVCC" not in os.environ
    # A user's own PYTORCH_NVCC (a ccache wrapper) is left alone: no overlapped nvcc is planned.
    monkeypatch.setenv("PYTORCH_NVCC", "ccache nvcc")
    assert kb_build.overlapped_nvcc() is None
