# KernelBench level 1 / 23 (Softmax over dim 1): row-wise softmax with accessors (CPU).
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = r"""
#include <torch/extension.h>
#include <algorithm>
#include <cmath>

torch::Tensor softmax_rows(torch::Tensor x) {
    TORCH_CHECK(x.dim() == 2, "softmax_rows expects a 2-D tensor");
    auto xc = x.contiguous().to(torch::kFloat32);
    auto out = torch::empty_like(xc);
    auto in = xc.accessor<float, 2>();
    auto o = out.accessor<float, 2>();
    for (int64_t r = 0; r < xc.size(0); ++r) {
        float m = -INFINITY;
        for (int64_t c = 0; c < xc.size(1); ++c) m = std::max(m, in[r][c]);
        float s = 0.0f;
        for (int64_t c = 0; c < xc.size(1); ++c) {
            float e = std::exp(in[r][c] - m);
            o[r][c] = e;
            s += e;
        }
        for (int64_t c = 0; c < xc.size(1); ++c) o[r][c] /= s;
    }
    return out;
}
"""

softmax_ext = load_inline(
    name="bench_softmax_cpp",
    cpp_sources=source,
    functions=["softmax_rows"],
    extra_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return softmax_ext.softmax_rows(x)
