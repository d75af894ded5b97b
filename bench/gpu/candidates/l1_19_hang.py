# Hostile: a kernel that never ends (the orchestrator's execute timeout must end it).
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

__global__ void spin(float* y, volatile int* flag) {
    while (*flag == 0) { }
    y[0] = 0.f;
}

torch::Tensor relu(torch::Tensor x) {
    auto y = torch::empty_like(x);
    auto flag = torch::zeros({1}, x.options().dtype(torch::kInt32));
    spin<<<1, 1, 0, at::cuda::getCurrentCUDAStream()>>>(y.data_ptr<float>(), flag.data_ptr<int>());
    return y;
}
"""

module = load_inline(name="krefine_hang", cpp_sources="torch::Tensor relu(torch::Tensor x);",
                     cuda_sources=source, functions=["relu"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return module.relu(x)
