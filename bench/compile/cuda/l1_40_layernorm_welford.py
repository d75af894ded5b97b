# KernelBench level 1 / 40 (LayerNorm): a block per row, Welford statistics in shared memory.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

__global__ void layernorm_rows(const float* x, const float* w, const float* b, float* y, int D, float eps) {
    extern __shared__ float sh[];
    float* s_mean = sh;
    float* s_m2 = sh + blockDim.x;
    const float* row = x + (size_t)blockIdx.x * D;
    float mean = 0.f, m2 = 0.f; int n = 0;
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        float v = row[i]; n++;
        float d = v - mean; mean += d / n; m2 += d * (v - mean);
    }
    s_mean[threadIdx.x] = mean * n; s_m2[threadIdx.x] = m2;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) { s_mean[threadIdx.x] += s_mean[threadIdx.x + s]; }
        __syncthreads();
    }
    float mu = s_mean[0] / D;
    __syncthreads();
    float sq = 0.f;
    for (int i = threadIdx.x; i < D; i += blockDim.x) { float d = row[i] - mu; sq += d * d; }
    s_m2[threadIdx.x] = sq;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) s_m2[threadIdx.x] += s_m2[threadIdx.x + s];
        __syncthreads();
    }
    float inv = rsqrtf(s_m2[0] / D + eps);
    for (int i = threadIdx.x; i < D; i += blockDim.x)
        y[(size_t)blockIdx.x * D + i] = (row[i] - mu) * inv * w[i] + b[i];
}

torch::Tensor layernorm(torch::Tensor x, torch::Tensor w, torch::Tensor b, double eps) {
    auto xc = x.contiguous();
    int D = w.numel();
    int rows = xc.numel() / D;
    auto y = torch::empty_like(xc);
    int threads = 512;
    layernorm_rows<<<rows, threads, 2 * threads * sizeof(float), at::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<float>(), w.contiguous().data_ptr<float>(), b.contiguous().data_ptr<float>(),
        y.data_ptr<float>(), D, (float)eps);
    return y;
}
"""

ln = load_inline(
    name="bench_layernorm_welford",
    cpp_sources="torch::Tensor layernorm(torch::Tensor x, torch::Tensor w, torch::Tensor b, double eps);",
    cuda_sources=cuda_source,
    functions=["layernorm"],
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self, normalized_shape):
        super().__init__()
        self.ln = nn.LayerNorm(normalized_shape)

    def forward(self, x):
        return ln.layernorm(x, self.ln.weight, self.ln.bias, self.ln.eps)
