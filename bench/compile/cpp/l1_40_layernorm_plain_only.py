# KernelBench level 1 / 40 (LayerNorm): writes its own bindings and asks torch for no implicit headers,
# so krefine leaves it to the plain build (recorded as `plain`).
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = r"""
#include <torch/extension.h>
#include <cmath>

torch::Tensor layer_norm_last(torch::Tensor x, torch::Tensor w, torch::Tensor b, double eps) {
    auto xc = x.contiguous();
    const int64_t D = w.numel();
    const int64_t rows = xc.numel() / D;
    auto out = torch::empty_like(xc);
    const float* in = xc.data_ptr<float>();
    const float* pw = w.contiguous().data_ptr<float>();
    const float* pb = b.contiguous().data_ptr<float>();
    float* o = out.data_ptr<float>();
    for (int64_t r = 0; r < rows; ++r) {
        double mean = 0, var = 0;
        for (int64_t i = 0; i < D; ++i) mean += in[r * D + i];
        mean /= D;
        for (int64_t i = 0; i < D; ++i) var += (in[r * D + i] - mean) * (in[r * D + i] - mean);
        const double inv = 1.0 / std::sqrt(var / D + eps);
        for (int64_t i = 0; i < D; ++i) o[r * D + i] = (in[r * D + i] - mean) * inv * pw[i] + pb[i];
    }
    return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("layer_norm_last", &layer_norm_last); }
"""

ln_ext = load_inline(name="bench_layernorm_cpp", cpp_sources=source, no_implicit_headers=True)


class ModelNew(nn.Module):
    def __init__(self, normalized_shape):
        super().__init__()
        self.ln = nn.LayerNorm(normalized_shape)

    def forward(self, x):
        return ln_ext.layer_norm_last(x, self.ln.weight, self.ln.bias, self.ln.eps)
