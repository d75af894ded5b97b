# KernelBench level 2 / 63 (Gemm + ReLU + divide): calls the C++ frontend's functional API from the
# .cu file, which only torch/extension.h declares, so the narrowed build fails and krefine falls back
# to the plain build (recorded as `fallback:fast-build-failed`).
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

namespace F = torch::nn::functional;

__global__ void relu_div(float* y, int64_t n, float inv) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] = fmaxf(y[i], 0.f) * inv;
}

torch::Tensor gemm_relu_div(torch::Tensor x, torch::Tensor w, torch::Tensor b, double divisor) {
    auto y = F::linear(x, w, b).contiguous();
    int64_t n = y.numel();
    relu_div<<<(n + 255) / 256, 256, 0, at::cuda::getCurrentCUDAStream()>>>(
        y.data_ptr<float>(), n, (float)(1.0 / divisor));
    return y;
}
"""

fused = load_inline(
    name="bench_gemm_relu_div",
    cpp_sources="torch::Tensor gemm_relu_div(torch::Tensor x, torch::Tensor w, torch::Tensor b, double divisor);",
    cuda_sources=cuda_source,
    functions=["gemm_relu_div"],
)


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, divisor):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.divisor = divisor

    def forward(self, x):
        return fused.gemm_relu_div(x, self.linear.weight, self.linear.bias, self.divisor)
