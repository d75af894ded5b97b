"""kb_cusplit: a CUDA extension's `.cu` as a device unit (nvcc, no torch) and a host unit (the host
compiler). The split is read from the source without compiling; a real nvcc (NVIDIA's wheels, as in
test_nvcc.py) and g++ then build both units of a torch-free source, and the device code must be the one
nvcc makes of the whole source, and the host unit must link against the device unit's launchers."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

import kb_cusplit
from test_nvcc import _device_code, _nvcc

SOURCE = r"""#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#define TILE 32

struct Pair { float a, b; };
__device__ __forceinline__ float twice(float x) { return 2.f * x; }

template <typename scalar_t, int UNROLL = 2>
__global__ void scale(const scalar_t* __restrict__ in, scalar_t* __restrict__ out, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i] * scalar_t(UNROLL);
}

namespace ops {
__global__ void add_pair(Pair p, float* out) { out[threadIdx.x] = twice(p.a) + p.b; }
}

torch::Tensor run(torch::Tensor x) {
    auto y = torch::empty_like(x);
    int64_t n = x.numel();
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "run", [&] {
        scale<scalar_t><<<(n + 255) / 256, 256, 0,
                          at::cuda::getCurrentCUDAStream()>>>(x.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), n);
    });
    ops::add_pair<<<1, TILE>>>(Pair{1.f, 2.f}, y.data_ptr<float>());
    return y;
}
"""


def _kernels_code(fatbin: bytes) -> dict[str, bytes]:
    """Each kernel's machine code (its `.text.<name>` section) in the cubins of a fat binary."""
    out: dict[str, bytes] = {}
    at = fatbin.find(b"\x7fELF")
    while at >= 0:
        elf = fatbin[at:]
        shoff, = struct.unpack_from("<Q", elf, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
        sections = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize) for i in range(shnum)]
        names = sections[shstrndx]
        for name_at, _kind, _flags, _addr, offset, size, *_ in sections:
            end = elf.index(b"\0", names[4] + name_at)
            name = elf[names[4] + name_at : end].decode()
            if name.startswith(".text."):
                out[name] = elf[offset : offset + size]
        at = fatbin.find(b"\x7fELF", at + 4)
    return out


def _split(source: str = SOURCE) -> kb_cusplit.CudaSplit:
    split = kb_cusplit.split_cuda(source, "/b/cuda.cu")
    assert isinstance(split, kb_cusplit.CudaSplit), split
    return split


def test_units_keep_the_sources_lines_and_each_gets_its_part() -> None:
    split = _split()
    lines = SOURCE.count("\n")
    # One `#line` first, then every line where the source has it.
    assert split.device.count("\n") == lines + 1 and split.host.count("\n") == lines + 1
    assert split.device.startswith(f'#line {kb_cusplit.FIRST_LINE} "/b/cuda.cu"\n')
    dev, host = split.device.splitlines()[1:], split.host.splitlines()[1:]
    src = SOURCE.splitlines()
    for i, line in enumerate(src):
        if "out[i] = in[i]" in line:
            assert dev[i] == line and not host[i].strip()
        if "twice(p.a)" in line:  # a kernel's last line: its launcher follows it on that line
            assert dev[i].startswith(line + " void krefine_launch_add_pair(")
            assert host[i].strip().startswith("void krefine_launch_add_pair(") and "twice" not in host[i]
        if "y.data_ptr<scalar_t>(), n)" in line:
            assert not dev[i].strip()
    # Torch's headers are the host unit's (torch/extension.h narrowed); the device unit has none.
    assert "torch/" not in split.device and "ATen/" not in split.device
    assert "#include <torch/types.h>" in split.host and "#define TILE 32" in split.device + split.host
    assert "struct Pair" in split.device and "struct Pair" in split.host
    # Launches became launcher calls, the kernels launcher declarations.
    assert "<<<" not in split.host
    assert "krefine_launch_scale<scalar_t>(dim3((n + 255) / 256), dim3(256), 0," in split.host
    assert "ops::krefine_launch_add_pair(dim3(1), dim3(TILE), 0, 0, Pair{1.f, 2.f}, y.data_ptr<float>())" in split.host
    assert "template <typename scalar_t , int UNROLL = 2> void krefine_launch_scale(" in split.host
    assert split.kernels == ["add_pair", "scale"] and split.templates == ["krefine_launch_scale"]


@pytest.mark.parametrize(
    ("source", "why"),
    [
        ("namespace { __global__ void k(float* x) {} }\nvoid f(float* x) { k<<<1, 1>>>(x); }\n", "anonymous namespace"),
        ("__global__ void k(float* x) {}\nvoid f() { cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, 1); }\n", "other than in a launch"),
        ("#include <cub/cub.cuh>\n__global__ void k(float* x) {}\nvoid f(float* x) { cub::DeviceReduce::Sum(nullptr, 0, x, x, 1); k<<<1,1>>>(x); }\n", "needs nvcc"),
        ('extern "C" {\n__global__ void k(float* x) {}\n}\n', 'extern "C"'),
        ("__global__ void k(float*);\n__global__ void k(float* x) {}\n", "declared apart"),
        ("void f(float* x) {}\n", "no kernel"),
        ("__global__ void k(float* x) {}\nvoid f(float* x) { k<<<1>>>(x); }\n", "configuration"),
        ("__global__ void k(float*) {}\n", "without a name"),
    ],
)
def test_what_is_not_split_says_why_before_anything_is_built(source: str, why: str) -> None:
    result = kb_cusplit.split_cuda(source, "/b/cuda.cu")
    assert isinstance(result, str) and why in result, result


def test_the_host_unit_gets_the_flags_nvcc_gives_its_host_compiler() -> None:
    flags = kb_cusplit.host_extra_cflags(["-DX=1"], ["-O3", "--use_fast_math", "-Xcompiler", "-fopenmp,-march=native", "-DTILE=32", "-lineinfo"])
    assert flags[0] == "-DX=1"
    # torch's macros for nvcc (they shape the CUDA headers' host code), then the host part of the rest.
    assert "-D__CUDA_NO_HALF_OPERATORS__" in flags
    assert flags[-4:] == ["-O3", "-fopenmp", "-march=native", "-DTILE=32"]
    assert "--use_fast_math" not in flags and "-lineinfo" not in flags


def test_a_host_device_function_is_in_both_units_and_defined_once() -> None:
    source = "__host__ __device__ float g(float x) { return x; }\n__global__ void k(float* x) { x[0] = g(1.f); }\n"
    split = _split(source)
    assert "\n__host__ __device__ float g(" in split.device
    assert "\nstatic __host__ __device__ float g(" in split.host


def test_instantiations_are_read_from_the_host_units_undefined_symbols() -> None:
    undefined = [
        "void krefine_launch_scale<c10::Half, 2>(dim3, dim3, unsigned long, CUstream_st*, c10::Half const*, c10::Half*, long)",
        "void krefine_launch_scale<float, 2>(dim3, dim3, unsigned long, CUstream_st*, float const*, float*, long)",
        "at::Tensor::data_ptr() const",
    ]
    found = kb_cusplit.instantiations(undefined, ["krefine_launch_scale"])
    assert found == (
        [
            "template void krefine_launch_scale<c10::Half, 2>(dim3, dim3, unsigned long, CUstream_st*, c10::Half const*, c10::Half*, long);",
            "template void krefine_launch_scale<float, 2>(dim3, dim3, unsigned long, CUstream_st*, float const*, float*, long);",
        ],
        ["c10/util/Half.h"],
    )
    odd = "void krefine_launch_scale<at::Float8_e5m2, 2>(dim3, dim3, unsigned long, CUstream_st*, long)"
    assert isinstance(kb_cusplit.instantiations([odd], ["krefine_launch_scale"]), str)


def test_only_errors_the_rewriting_cannot_cause_are_the_candidates() -> None:
    syntax = "/b/cuda.cu(12): error: expected a \";\"\n1 error detected in the compilation of \"/b/cuda.cu\".\n"
    undeclared = "/b/krefine_host.cpp:9:5: error: 'foo' was not declared in this scope\n"
    link = "/usr/bin/ld: krefine_host.o: undefined reference to `krefine_launch_k'\n"
    assert kb_cusplit.candidates_fault(syntax, rewritten=True)
    # An extension named after krefine is still the candidate's.
    own = "/b/krefine_fixture_x/main.cpp:7:5: error: expected ',' or ';' before 'return'\n"
    assert kb_cusplit.candidates_fault(own, rewritten=True, known=set())
    assert not kb_cusplit.candidates_fault(undeclared, rewritten=True)
    assert kb_cusplit.candidates_fault(undeclared.replace("krefine_host.cpp", "main.cpp"), rewritten=False)
    assert not kb_cusplit.candidates_fault(link, rewritten=True)
    # A name no header of the plain build declares and the sources name only where it failed: a typo.
    typo = "k/main.cpp:5:12: error: 'undeclared_name' was not declared in this scope\n"
    source = "torch::Tensor f(torch::Tensor a) {\n    return undeclared_name;\n}\n"
    assert kb_cusplit.candidates_fault(typo, rewritten=True, known={"torch", "Tensor"}, sources=source)
    assert not kb_cusplit.candidates_fault(typo, rewritten=True, known={"undeclared_name"}, sources=source)
    assert not kb_cusplit.candidates_fault(typo, rewritten=True, known=None, sources=source)
    # Declared in the sources: a unit lost it (the split put it elsewhere).
    declared = "static int undeclared_name = 1;\n" + source
    assert not kb_cusplit.candidates_fault(typo, rewritten=True, known={"torch"}, sources=declared)
    nvcc = '/b/cuda.cu(9): error: identifier "tpyo" is undefined\n'
    assert kb_cusplit.candidates_fault(nvcc, rewritten=True, known=set(), sources="x = tpyo;")
    misread = "k/main.cpp:6:83: error: static assertion failed: krefine: the split build misread the signature of f\n"
    assert not kb_cusplit.candidates_fault(misread, rewritten=False)
    # No error reported (a crash, a killed compiler, krefine's own code): never the candidate's.
    assert not kb_cusplit.candidates_fault("Segmentation fault\n", rewritten=False)
    assert not kb_cusplit.candidates_fault("Traceback (most recent call last):\n  error: x\n", rewritten=False)


TORCH_FREE = r"""#include <cstdint>
#include <cuda_runtime.h>
template <typename T>
__global__ void axpy(T a, const T* __restrict__ x, T* __restrict__ y, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] += a * x[i];
}
__global__ void fill(float* y, float v, int n) { if (threadIdx.x < n) y[threadIdx.x] = v; }
template <typename T> void run_axpy(T a, const T* x, T* y, int64_t n, cudaStream_t s) {
    axpy<<<dim3((n + 127) / 128), 128, 0, s>>>(a, x, y, n);
}
void run(float* xf, float* yf, double* xd, double* yd, int64_t n, cudaStream_t s) {
    run_axpy(2.0f, xf, yf, n, s);
    run_axpy(3.0, xd, yd, n, s);
    fill<<<1, 32, 0, s>>>(yf, 1.f, 32);
}
"""


def test_both_units_build_and_link_with_the_whole_sources_device_code(tmp_path: Path) -> None:
    nvcc = _nvcc()
    if shutil.which("g++") is None or shutil.which("nm") is None or shutil.which("objcopy") is None:
        pytest.skip("g++ and binutils are needed")
    arch = ["-gencode=arch=compute_90,code=sm_90"]
    include = os.path.join(os.path.dirname(os.path.dirname(nvcc)), "include")

    def nvcc_c(source: Path, out: Path) -> None:
        done = subprocess.run([nvcc, *arch, "-Xcompiler", "-fPIC", "-c", str(source), "-o", str(out)], capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr

    whole = tmp_path / "whole.cu"
    whole.write_text(TORCH_FREE)
    nvcc_c(whole, tmp_path / "whole.o")

    split = kb_cusplit.split_cuda(TORCH_FREE, str(tmp_path / "cuda.cu"))
    assert isinstance(split, kb_cusplit.CudaSplit), split
    host = tmp_path / kb_cusplit.HOST_FILE
    host.write_text(split.host)
    done = subprocess.run(["g++", "-fPIC", "-std=c++17", "-isystem", include, "-c", str(host), "-o", str(tmp_path / "host.o")], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    symbols = subprocess.run(["nm", "-uC", str(tmp_path / "host.o")], capture_output=True, text=True, check=True).stdout
    undefined = [line.split(" U ", 1)[-1] for line in symbols.splitlines() if " U " in line]
    found = kb_cusplit.instantiations(undefined, split.templates)
    assert not isinstance(found, str), found
    instantiated, headers = found
    assert len(instantiated) == 2 and headers == []
    device = tmp_path / "cuda.cu"
    device.write_text(kb_cusplit.device_unit(split, instantiated, headers))
    nvcc_c(device, tmp_path / "device.o")

    # The kernels' machine code: each kernel's the same bytes as in the whole source's object (the
    # explicit instantiations may come in another order than the host code's implicit ones).
    ours, theirs = _kernels_code(_device_code(tmp_path / "device.o")), _kernels_code(_device_code(tmp_path / "whole.o"))
    assert len(theirs) == 3 and ours == theirs
    # The host unit's launcher calls are the device unit's definitions: a shared object with no
    # launcher left undefined.
    lib = tmp_path / "both.so"
    done = subprocess.run(["g++", "-shared", str(tmp_path / "host.o"), str(tmp_path / "device.o"), "-o", str(lib)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    left = subprocess.run(["nm", "-uC", str(lib)], capture_output=True, text=True, check=True).stdout
    assert kb_cusplit.LAUNCHER_PREFIX not in left
