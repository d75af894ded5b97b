import os

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

# ThunderKittens is a header-only library: its checkout is named by THUNDERKITTENS_ROOT.
TK_ROOT = os.environ.get("THUNDERKITTENS_ROOT", "ThunderKittens")

cuda_source = r"""
#include "kittens.cuh"
#include <torch/extension.h>

using namespace kittens;

// One warp adds one 16x16 bf16 tile, held in registers.
using tile = rt_bf<16, 16>;
using global = gl<bf16, 1, 1, -1, -1>;

struct add_args {
    global a, b, out;
};

__global__ void add_tiles(const __grid_constant__ add_args args) {
    tile a, b, sum;
    int row = blockIdx.y, col = blockIdx.x;
    warp::load(a, args.a, {0, 0, row, col});
    warp::load(b, args.b, {0, 0, row, col});
    warp::add(sum, a, b);
    warp::store(args.out, sum, {0, 0, row, col});
}

torch::Tensor tk_add(torch::Tensor a, torch::Tensor b) {
    TORCH_CHECK(a.is_cuda() && b.is_cuda(), "inputs must be CUDA tensors");
    TORCH_CHECK(a.scalar_type() == torch::kBFloat16 && b.scalar_type() == torch::kBFloat16, "inputs must be bf16");
    TORCH_CHECK(a.dim() == 2 && a.sizes() == b.sizes(), "inputs must be matrices of one shape");
    TORCH_CHECK(a.size(0) % 16 == 0 && a.size(1) % 16 == 0, "sides must be multiples of 16");
    a = a.contiguous();
    b = b.contiguous();
    auto out = torch::empty_like(a);
    size_t rows = a.size(0), cols = a.size(1);
    auto view = [&](torch::Tensor t) {
        return global{reinterpret_cast<bf16*>(t.data_ptr()), nullptr, nullptr, rows, cols};
    };
    add_args args{view(a), view(b), view(out)};
    dim3 grid(cols / 16, rows / 16);
    add_tiles<<<grid, kittens::WARP_THREADS>>>(args);
    return out;
}
"""

cpp_source = "torch::Tensor tk_add(torch::Tensor a, torch::Tensor b);"

tk = load_inline(
    name="tk_add",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["tk_add"],
    extra_include_paths=[TK_ROOT, os.path.join(TK_ROOT, "include")],
    extra_cflags=["-std=c++20", "-O3"],
    extra_cuda_cflags=[
        "-std=c++20",
        "-O3",
        "-arch=sm_90a",
        "-DKITTENS_HOPPER",
        "--expt-relaxed-constexpr",
        "--expt-extended-lambda",
        "-U__CUDA_NO_HALF_OPERATORS__",
        "-U__CUDA_NO_HALF_CONVERSIONS__",
        "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
        "-U__CUDA_NO_HALF2_OPERATORS__",
    ],
    extra_ldflags=["-lcuda"],
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        # Inputs reach the model in bf16 (ThunderKittens runs are bf16, as KernelBench's).
        return tk.tk_add(a, b)
