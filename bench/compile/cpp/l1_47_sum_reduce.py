# KernelBench level 1 / 47 (sum over a dim, keepdim): AT_DISPATCH over float types, default flags.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = r"""
#include <torch/extension.h>

template <typename scalar_t>
void sum_dim1(const scalar_t* in, scalar_t* out, int64_t outer, int64_t reduce, int64_t inner) {
    for (int64_t o = 0; o < outer; ++o)
        for (int64_t i = 0; i < inner; ++i) {
            scalar_t acc = 0;
            for (int64_t r = 0; r < reduce; ++r) acc += in[(o * reduce + r) * inner + i];
            out[o * inner + i] = acc;
        }
}

torch::Tensor sum_reduce(torch::Tensor x, int64_t dim) {
    auto xc = x.contiguous();
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < dim; ++d) outer *= xc.size(d);
    for (int64_t d = dim + 1; d < xc.dim(); ++d) inner *= xc.size(d);
    auto sizes = xc.sizes().vec();
    sizes[dim] = 1;
    auto out = torch::empty(sizes, xc.options());
    AT_DISPATCH_FLOATING_TYPES(xc.scalar_type(), "sum_reduce", [&] {
        sum_dim1<scalar_t>(xc.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), outer, xc.size(dim), inner);
    });
    return out;
}
"""

sum_ext = load_inline(name="bench_sum_reduce_cpp", cpp_sources=source, functions=["sum_reduce"])


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return sum_ext.sum_reduce(x, self.dim)
