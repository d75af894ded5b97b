# KernelBench level 1 / 88 (MinGPT new GELU): tanh GELU with -O3 -ffast-math (its own flags).
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = "torch::Tensor gelu_tanh(torch::Tensor x);"
impl_source = r"""
#include <torch/extension.h>
#include <cmath>

torch::Tensor gelu_tanh(torch::Tensor x) {
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    const float* in = xc.data_ptr<float>();
    float* o = out.data_ptr<float>();
    const float k = std::sqrt(2.0f / static_cast<float>(M_PI));
    for (int64_t i = 0; i < xc.numel(); ++i) {
        const float v = in[i];
        o[i] = 0.5f * v * (1.0f + std::tanh(k * (v + 0.044715f * v * v * v)));
    }
    return out;
}
"""

gelu_ext = load_inline(
    name="bench_gelu_cpp",
    cpp_sources=[cpp_source, impl_source],
    functions={"gelu_tanh": "tanh-approximated GELU"},
    extra_cflags=["-O3", "-ffast-math"],
    with_pytorch_error_handling=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return gelu_ext.gelu_tanh(x)
