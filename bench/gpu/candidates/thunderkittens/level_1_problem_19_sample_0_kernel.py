# Level 1 problem 19 (ReLU over a 4096 x 393216 tensor, bf16 as KernelBench forces for ThunderKittens):
# the prompt's worked example (KernelBench's element-wise add of 16 x 16 register tiles, one warp per
# tile) with the add made ThunderKittens' tile ReLU. 4096 and 393216 are multiples of 16.
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

// One warp applies ReLU to one 16x16 bf16 tile, held in registers.
using tile = rt_bf<16, 16>;
using global = gl<bf16, 1, 1, -1, -1>;

struct relu_args {
    global x, out;
};

__global__ void relu_tiles(const __grid_constant__ relu_args args) {
    tile x, y;
    int row = blockIdx.y, col = blockIdx.x;
    warp::load(x, args.x, {0, 0, row, col});
    warp::relu(y, x);
    warp::store(args.out, y, {0, 0, row, col});
}

torch::Tensor tk_relu(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda(), "input must be a CUDA tensor");
    TORCH_CHECK(x.scalar_type() == torch::kBFloat16, "input must be bf16");
    TORCH_CHECK(x.dim() == 2, "input must be a matrix");
    TORCH_CHECK(x.size(0) % 16 == 0 && x.size(1) % 16 == 0, "sides must be multiples of 16");
    x = x.contiguous();
    auto out = torch::empty_like(x);
    size_t rows = x.size(0), cols = x.size(1);
    auto view = [&](torch::Tensor t) {
        return global{reinterpret_cast<bf16*>(t.data_ptr()), nullptr, nullptr, rows, cols};
    };
    relu_args args{view(x), view(out)};
    dim3 grid(cols / 16, rows / 16);
    relu_tiles<<<grid, kittens::WARP_THREADS>>>(args);
    return out;
}
"""

cpp_source = "torch::Tensor tk_relu(torch::Tensor x);"

tk = load_inline(
    name="tk_relu",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["tk_relu"],
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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The input reaches the model in bf16 (ThunderKittens runs are bf16, as KernelBench's).
        return tk.tk_relu(x)
