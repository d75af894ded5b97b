# KernelBench level 2 / 40 (Matmul + scaling + residual): cuBLAS GEMM through at::addmm, then a fused
# epilogue kernel; two functions bound.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = """
torch::Tensor linear_scaled(torch::Tensor x, torch::Tensor w, torch::Tensor b, double scale);
torch::Tensor scale_residual(torch::Tensor y, double scale);
"""

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

__global__ void scale_residual_kernel(float* y, int64_t n, float factor) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] = y[i] * factor;
}

torch::Tensor scale_residual(torch::Tensor y, double scale) {
    int64_t n = y.numel();
    scale_residual_kernel<<<(n + 511) / 512, 512, 0, at::cuda::getCurrentCUDAStream()>>>(
        y.data_ptr<float>(), n, (float)(1.0 + scale));
    return y;
}

torch::Tensor linear_scaled(torch::Tensor x, torch::Tensor w, torch::Tensor b, double scale) {
    auto y = at::addmm(b, x, w.t()).contiguous();
    return scale_residual(y, scale);
}
"""

fused = load_inline(
    name="bench_matmul_scale_residual",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["linear_scaled", "scale_residual"],
)


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, scaling_factor):
        super().__init__()
        self.matmul = nn.Linear(in_features, out_features)
        self.scaling_factor = scaling_factor

    def forward(self, x):
        return fused.linear_scaled(x, self.matmul.weight, self.matmul.bias, self.scaling_factor)
