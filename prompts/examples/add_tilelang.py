import torch
import torch.nn as nn
import tilelang
import tilelang.language as T


def build_add(n: int, dtype: str, block: int = 1024, threads: int = 256):
    """An element-wise add over `n` elements, compiled for these sizes; returns its output."""

    @T.prim_func
    def add(
        A: T.Tensor((n,), dtype),
        B: T.Tensor((n,), dtype),
        C: T.Tensor((n,), dtype),
    ):
        # One block of `block` elements per program, spread over `threads` threads.
        with T.Kernel(T.ceildiv(n, block), threads=threads) as bx:
            for i in T.Parallel(block):
                idx = bx * block + i
                if idx < n:  # the last block may run past the end
                    C[idx] = A[idx] + B[idx]

    # out_idx=[2]: C is allocated by the kernel and returned.
    return tilelang.compile(add, out_idx=[2], target="cuda")


DTYPES = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32"}


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.kernels = {}

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        assert a.is_cuda and b.is_cuda and a.shape == b.shape and a.dtype == b.dtype
        key = (a.numel(), a.dtype)
        if key not in self.kernels:
            self.kernels[key] = build_add(a.numel(), DTYPES[a.dtype])
        out = self.kernels[key](a.contiguous().view(-1), b.contiguous().view(-1))
        return out.view(a.shape)
