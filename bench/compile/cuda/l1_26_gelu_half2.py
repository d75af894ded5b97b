# KernelBench level 1 / 26 (GELU) for half inputs: half2 math, float32 falls back to a scalar kernel.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <cuda_fp16.h>

__device__ __forceinline__ float gelu(float v) {
    return 0.5f * v * (1.f + erff(v * 0.70710678f));
}

__global__ void gelu_f32(const float* x, float* y, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = gelu(x[i]);
}

__global__ void gelu_h2(const __half2* x, __half2* y, int64_t n2) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n2; i += (int64_t)gridDim.x * blockDim.x) {
        float2 f = __half22float2(x[i]);
        y[i] = __floats2half2_rn(gelu(f.x), gelu(f.y));
    }
}

torch::Tensor gelu_cuda(torch::Tensor x) {
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    auto stream = at::cuda::getCurrentCUDAStream();
    int64_t n = xc.numel();
    if (xc.scalar_type() == at::kHalf && n % 2 == 0) {
        gelu_h2<<<1024, 256, 0, stream>>>(reinterpret_cast<const __half2*>(xc.data_ptr<at::Half>()),
                                          reinterpret_cast<__half2*>(y.data_ptr<at::Half>()), n / 2);
    } else {
        gelu_f32<<<1024, 256, 0, stream>>>(xc.data_ptr<float>(), y.data_ptr<float>(), n);
    }
    return y;
}
"""

gelu = load_inline(
    name="bench_gelu_half2",
    cpp_sources="torch::Tensor gelu_cuda(torch::Tensor x);",
    cuda_sources=cuda_source,
    functions=["gelu_cuda"],
    extra_cuda_cflags=["-O3", "--use_fast_math"],
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return gelu.gelu_cuda(x)
