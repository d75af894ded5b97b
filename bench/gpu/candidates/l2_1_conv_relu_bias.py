# Conv2d stays in cuDNN; ReLU and the per-channel bias add are fused into one in-place kernel, saving
# two full passes over the (128, 128, 126, 126) activation.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

__global__ void relu_bias(float* __restrict__ x, const float* __restrict__ bias, int64_t n,
                          int64_t hw, int64_t channels) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t c = (i / hw) % channels;
        x[i] = fmaxf(x[i], 0.f) + bias[c];
    }
}

torch::Tensor relu_bias_(torch::Tensor x, torch::Tensor bias) {
    TORCH_CHECK(x.is_cuda() && x.is_contiguous() && x.scalar_type() == torch::kFloat32);
    auto b = bias.contiguous();
    int64_t n = x.numel(), channels = x.size(1), hw = x.size(2) * x.size(3);
    int blocks = (int)std::min<int64_t>((n + 255) / 256, 132 * 32);
    relu_bias<<<blocks, 256, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), b.data_ptr<float>(), n, hw, channels);
    return x;
}
"""

module = load_inline(
    name="krefine_relu_bias",
    cpp_sources="torch::Tensor relu_bias_(torch::Tensor x, torch::Tensor bias);",
    cuda_sources=source,
    functions=["relu_bias_"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, bias_shape):
        super().__init__()
        # Same parameters, created in the same order as the reference, so seeded weights match.
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.bias = nn.Parameter(torch.randn(bias_shape))

    def forward(self, x):
        return module.relu_bias_(self.conv(x).contiguous(), self.bias)
