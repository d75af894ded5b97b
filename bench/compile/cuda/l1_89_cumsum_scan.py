# KernelBench level 1 / 89 (cumsum along dim 1): a block-wide scan per row with cub.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <cub/block/block_scan.cuh>

constexpr int THREADS = 256;

__global__ void cumsum_rows(const float* x, float* y, int cols) {
    using Scan = cub::BlockScan<float, THREADS>;
    __shared__ typename Scan::TempStorage tmp;
    __shared__ float carry;
    if (threadIdx.x == 0) carry = 0.f;
    __syncthreads();
    const float* row = x + (size_t)blockIdx.x * cols;
    float* out = y + (size_t)blockIdx.x * cols;
    for (int base = 0; base < cols; base += THREADS) {
        int c = base + threadIdx.x;
        float v = c < cols ? row[c] : 0.f, incl, total;
        Scan(tmp).InclusiveSum(v, incl, total);
        if (c < cols) out[c] = incl + carry;
        __syncthreads();
        if (threadIdx.x == 0) carry += total;
        __syncthreads();
    }
}

torch::Tensor cumsum_cuda(torch::Tensor x) {
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    cumsum_rows<<<xc.size(0), THREADS, 0, at::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<float>(), y.data_ptr<float>(), (int)xc.size(1));
    return y;
}
"""

scan = load_inline(
    name="bench_cumsum_scan",
    cpp_sources="torch::Tensor cumsum_cuda(torch::Tensor x);",
    cuda_sources=cuda_source,
    functions=["cumsum_cuda"],
)


class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return scan.cumsum_cuda(x)
