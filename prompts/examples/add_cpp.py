import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

add_cpp_source = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>

torch::Tensor add_forward(torch::Tensor a, torch::Tensor b) {
    TORCH_CHECK(a.device().is_cpu() && b.device().is_cpu(), "add_forward: inputs must be CPU tensors");
    TORCH_CHECK(a.sizes() == b.sizes(), "add_forward: inputs must have the same shape");
    TORCH_CHECK(a.scalar_type() == b.scalar_type(), "add_forward: inputs must have the same dtype");
    auto a_c = a.contiguous();
    auto b_c = b.contiguous();
    auto out = torch::empty_like(a_c);
    const int64_t n = a_c.numel();
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a_c.scalar_type(), "add_forward", [&] {
        const scalar_t* pa = a_c.data_ptr<scalar_t>();
        const scalar_t* pb = b_c.data_ptr<scalar_t>();
        scalar_t* po = out.data_ptr<scalar_t>();
        // Split the range over PyTorch's thread pool; the simple inner loop lets the compiler
        // vectorize it.
        at::parallel_for(0, n, 1 << 14, [&](int64_t begin, int64_t end) {
            for (int64_t i = begin; i < end; ++i) {
                po[i] = pa[i] + pb[i];
            }
        });
    });
    return out;
}
"""

# CPU only: C++ sources and no CUDA sources. Compiled once, when the module is imported.
add_ext = load_inline(
    name="example_add_cpp",
    cpp_sources=add_cpp_source,
    functions=["add_forward"],
    extra_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return add_ext.add_forward(a, b)
