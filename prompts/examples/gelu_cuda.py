import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

bias_gelu_cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

// One pass instead of two: the bias add and the GELU are fused, so x is read once and the
// result written once, with no intermediate tensor in global memory.
template <typename scalar_t>
__global__ void bias_gelu_kernel(const scalar_t* __restrict__ x,
                                 const scalar_t* __restrict__ bias,
                                 scalar_t* __restrict__ out,
                                 int64_t n,
                                 int64_t features) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (; i < n; i += stride) {
        // Compute in float whatever the storage type, to match PyTorch's accuracy.
        const float v = static_cast<float>(x[i]) + static_cast<float>(bias[i % features]);
        out[i] = static_cast<scalar_t>(0.5f * v * (1.0f + erff(v * 0.70710678118654752f)));
    }
}

torch::Tensor bias_gelu_forward(torch::Tensor x, torch::Tensor bias) {
    TORCH_CHECK(x.is_cuda() && bias.is_cuda(), "bias_gelu_forward: inputs must be CUDA tensors");
    TORCH_CHECK(bias.dim() == 1 && x.size(-1) == bias.size(0),
                "bias_gelu_forward: bias must match the last dimension of x");
    TORCH_CHECK(x.scalar_type() == bias.scalar_type(), "bias_gelu_forward: dtypes must match");
    auto x_c = x.contiguous();
    auto b_c = bias.contiguous();
    auto out = torch::empty_like(x_c);
    const int64_t n = x_c.numel();
    if (n == 0) {
        return out;
    }
    const int threads = 256;
    const int64_t max_blocks = 32 * at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
    const int blocks = (int)std::min<int64_t>((n + threads - 1) / threads, max_blocks);
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x_c.scalar_type(), "bias_gelu_forward", [&] {
        bias_gelu_kernel<scalar_t><<<blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
            x_c.data_ptr<scalar_t>(), b_c.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), n, b_c.size(0));
    });
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

bias_gelu_cpp_source = "torch::Tensor bias_gelu_forward(torch::Tensor x, torch::Tensor bias);"

bias_gelu_ext = load_inline(
    name="example_bias_gelu_cuda",
    cpp_sources=bias_gelu_cpp_source,
    cuda_sources=bias_gelu_cuda_source,
    functions=["bias_gelu_forward"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        # Created exactly as in Model, so the same seed gives the same weights.
        self.bias = nn.Parameter(torch.randn(features) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return bias_gelu_ext.bias_gelu_forward(x, self.bias)
