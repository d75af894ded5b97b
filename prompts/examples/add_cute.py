import torch
import torch.nn as nn
import cutlass
import cutlass.cute as cute
from cutlass.cute.runtime import from_dlpack

THREADS = 256


@cute.kernel
def add_kernel(a: cute.Tensor, b: cute.Tensor, out: cute.Tensor, n: cutlass.Int32):
    # One thread per element of the flattened tensors.
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    i = bidx * THREADS + tidx
    if i < n:  # the last block may run past the end
        out[i] = a[i] + b[i]


@cute.jit
def launch_add(a: cute.Tensor, b: cute.Tensor, out: cute.Tensor, n: cutlass.Int32):
    blocks = (n + THREADS - 1) // THREADS
    add_kernel(a, b, out, n).launch(grid=(blocks, 1, 1), block=(THREADS, 1, 1))


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        # cute.compile builds the kernel for the argument types it sees; keep one per dtype.
        self.compiled = {}

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        assert a.is_cuda and b.is_cuda and a.shape == b.shape and a.dtype == b.dtype
        a_flat = a.contiguous().view(-1)
        b_flat = b.contiguous().view(-1)
        out = torch.empty_like(a_flat)
        args = [from_dlpack(t).mark_layout_dynamic() for t in (a_flat, b_flat, out)]
        n = cutlass.Int32(out.numel())
        kernel = self.compiled.get(a.dtype)
        if kernel is None:
            kernel = cute.compile(launch_add, *args, n)
            self.compiled[a.dtype] = kernel
        kernel(*args, n)
        return out.view(a.shape)
