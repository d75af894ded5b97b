# KernelBench level 2 / 1 (Conv2d + ReLU + bias): ATen conv, then a fused ReLU + bias loop (CPU).
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = r"""
#include <torch/extension.h>
#include <vector>

torch::Tensor conv_relu_bias(torch::Tensor x, torch::Tensor w, torch::Tensor cb, torch::Tensor bias) {
    auto y = torch::conv2d(x, w, cb).contiguous();
    auto b = bias.contiguous();
    const int64_t N = y.size(0), C = y.size(1), HW = y.size(2) * y.size(3);
    float* p = y.data_ptr<float>();
    const float* pb = b.data_ptr<float>();
    at::parallel_for(0, N * C, 1, [&](int64_t begin, int64_t end) {
        for (int64_t nc = begin; nc < end; ++nc) {
            const float add = pb[nc % C];
            float* row = p + nc * HW;
            for (int64_t i = 0; i < HW; ++i) row[i] = std::max(row[i], 0.0f) + add;
        }
    });
    return y;
}
"""

conv_ext = load_inline(
    name="bench_conv_relu_bias_cpp",
    cpp_sources=source,
    functions=["conv_relu_bias"],
    extra_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, bias_shape):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.bias = nn.Parameter(torch.randn(bias_shape))

    def forward(self, x):
        return conv_ext.conv_relu_bias(x, self.conv.weight, self.conv.bias, self.bias)
