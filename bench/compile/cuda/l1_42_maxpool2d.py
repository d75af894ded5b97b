# KernelBench level 1 / 42 (MaxPool2d): one thread per output element.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <cuda.h>
#include <cuda_runtime.h>
#include <ATen/cuda/CUDAContext.h>
#include <cfloat>

__global__ void maxpool2d(const float* in, float* out, int N, int C, int H, int W, int OH, int OW,
                          int k, int s, int p, int d) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    int total = N * C * OH * OW;
    if (idx >= total) return;
    int ow = idx % OW, oh = (idx / OW) % OH, nc = idx / (OW * OH);
    float m = -FLT_MAX;
    for (int i = 0; i < k; ++i)
        for (int j = 0; j < k; ++j) {
            int h = oh * s - p + i * d, w = ow * s - p + j * d;
            if (h >= 0 && h < H && w >= 0 && w < W) m = fmaxf(m, in[((size_t)nc * H + h) * W + w]);
        }
    out[idx] = m;
}

torch::Tensor maxpool_cuda(torch::Tensor x, int64_t k, int64_t s, int64_t p, int64_t d) {
    auto xc = x.contiguous();
    int N = xc.size(0), C = xc.size(1), H = xc.size(2), W = xc.size(3);
    int OH = (H + 2 * p - d * (k - 1) - 1) / s + 1, OW = (W + 2 * p - d * (k - 1) - 1) / s + 1;
    auto out = torch::empty({N, C, OH, OW}, xc.options());
    int total = N * C * OH * OW;
    maxpool2d<<<(total + 255) / 256, 256, 0, at::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<float>(), out.data_ptr<float>(), N, C, H, W, OH, OW, k, s, p, d);
    return out;
}
"""

pool = load_inline(
    name="bench_maxpool2d",
    cpp_sources="torch::Tensor maxpool_cuda(torch::Tensor x, int64_t k, int64_t s, int64_t p, int64_t d);",
    cuda_sources=cuda_source,
    functions=["maxpool_cuda"],
)


class ModelNew(nn.Module):
    def __init__(self, kernel_size, stride, padding, dilation):
        super().__init__()
        self.args = (kernel_size, stride, padding, dilation)

    def forward(self, x):
        return pool.maxpool_cuda(x, *self.args)
