# KernelBench level 1 / 47 (sum over a dim, keepdim): AT_DISPATCH over float types, one thread per output.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

template <typename scalar_t>
__global__ void sum_dim(const scalar_t* __restrict__ in, scalar_t* __restrict__ out,
                        int64_t outer, int64_t reduce, int64_t inner) {
    int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (idx >= outer * inner) return;
    int64_t o = idx / inner, i = idx % inner;
    scalar_t acc = 0;
    for (int64_t r = 0; r < reduce; ++r) acc += in[(o * reduce + r) * inner + i];
    out[idx] = acc;
}

torch::Tensor sum_reduce(torch::Tensor x, int64_t dim) {
    auto xc = x.contiguous();
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < dim; ++d) outer *= xc.size(d);
    for (int64_t d = dim + 1; d < xc.dim(); ++d) inner *= xc.size(d);
    auto sizes = xc.sizes().vec();
    sizes[dim] = 1;
    auto out = torch::empty(sizes, xc.options());
    int64_t total = outer * inner;
    AT_DISPATCH_FLOATING_TYPES_AND_HALF(xc.scalar_type(), "sum_reduce", [&] {
        sum_dim<scalar_t><<<(total + 255) / 256, 256, 0, at::cuda::getCurrentCUDAStream()>>>(
            xc.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), outer, xc.size(dim), inner);
    });
    return out;
}
"""

reduce_ext = load_inline(
    name="bench_sum_dispatch",
    cpp_sources="torch::Tensor sum_reduce(torch::Tensor x, int64_t dim);",
    cuda_sources=cuda_source,
    functions=["sum_reduce"],
)


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return reduce_ext.sum_reduce(x, self.dim)
