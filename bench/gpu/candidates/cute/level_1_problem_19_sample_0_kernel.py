# Level 1 problem 19 (ReLU over a 4096 x 393216 fp32 tensor) in the CuTe DSL: the prompt's worked
# example (KernelBench's element-wise add, one thread per element) with the add made a max against 0.
# 1.6 G elements fit an Int32 index (< 2^31).
import torch
import torch.nn as nn
import cutlass
import cutlass.cute as cute
from cutlass.cute.runtime import from_dlpack

THREADS = 256


@cute.kernel
def relu_kernel(x: cute.Tensor, y: cute.Tensor, n: cutlass.Int32):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    i = bidx * THREADS + tidx
    if i < n:  # the last block may run past the end
        # FMNMX against 0 (the problem is fp32, and so are the tensors the DSL sees).
        y[i] = cute.arch.fmax(x[i], cutlass.Float32(0.0))


@cute.jit
def launch_relu(x: cute.Tensor, y: cute.Tensor, n: cutlass.Int32):
    blocks = (n + THREADS - 1) // THREADS
    relu_kernel(x, y, n).launch(grid=(blocks, 1, 1), block=(THREADS, 1, 1))


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        # cute.compile builds the kernel for the argument types it sees; keep one per dtype.
        self.compiled = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert x.is_cuda
        x_flat = x.contiguous().view(-1)
        y = torch.empty_like(x_flat)
        args = [from_dlpack(t).mark_layout_dynamic() for t in (x_flat, y)]
        n = cutlass.Int32(y.numel())
        kernel = self.compiled.get(x.dtype)
        if kernel is None:
            kernel = cute.compile(launch_relu, *args, n)
            self.compiled[x.dtype] = kernel
        kernel(*args, n)
        return y.view(x.shape)
