# KernelBench level 1 / 1 (square matmul): a cache-blocked matmul (CPU), no explicit include.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = r"""
torch::Tensor matmul_tiled(torch::Tensor a, torch::Tensor b) {
    TORCH_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(0), "shape mismatch");
    auto A = a.contiguous();
    auto B = b.contiguous();
    const int64_t M = A.size(0), K = A.size(1), N = B.size(1);
    auto C = torch::zeros({M, N}, A.options());
    const float* pa = A.data_ptr<float>();
    const float* pb = B.data_ptr<float>();
    float* pc = C.data_ptr<float>();
    constexpr int64_t T = 64;
    for (int64_t i0 = 0; i0 < M; i0 += T)
        for (int64_t k0 = 0; k0 < K; k0 += T)
            for (int64_t j0 = 0; j0 < N; j0 += T)
                for (int64_t i = i0; i < std::min(i0 + T, M); ++i)
                    for (int64_t k = k0; k < std::min(k0 + T, K); ++k) {
                        const float aik = pa[i * K + k];
                        for (int64_t j = j0; j < std::min(j0 + T, N); ++j)
                            pc[i * N + j] += aik * pb[k * N + j];
                    }
    return C;
}
"""

matmul_ext = load_inline(
    name="bench_matmul_tiled_cpp",
    cpp_sources=source,
    functions=["matmul_tiled"],
    extra_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return matmul_ext.matmul_tiled(a, b)
