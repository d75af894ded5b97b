# Level 1 problem 19 (ReLU over a 4096 x 393216 tensor, fp16 as KernelBench forces for TileLang): the
# prompt's worked example (KernelBench's element-wise add) with the add made a max against 0.
import torch
import torch.nn as nn
import tilelang
import tilelang.language as T


def build_relu(n: int, dtype: str, block: int = 1024, threads: int = 256):
    """ReLU over `n` elements, compiled for this size; returns its output."""

    @T.prim_func
    def relu(
        X: T.Tensor((n,), dtype),
        Y: T.Tensor((n,), dtype),
    ):
        with T.Kernel(T.ceildiv(n, block), threads=threads) as bx:
            for i in T.Parallel(block):
                idx = bx * block + i
                if idx < n:  # the last block may run past the end
                    Y[idx] = T.max(X[idx], T.cast(0, dtype))

    # out_idx=[1]: Y is allocated by the kernel and returned.
    return tilelang.compile(relu, out_idx=[1], target="cuda")


DTYPES = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32"}


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.kernels = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert x.is_cuda
        key = (x.numel(), x.dtype)
        if key not in self.kernels:
            self.kernels[key] = build_relu(x.numel(), DTYPES[x.dtype])
        return self.kernels[key](x.contiguous().view(-1)).view(x.shape)
