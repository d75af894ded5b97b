# Level 1 problem 19 (ReLU over a 4096 x 393216 fp32 tensor): one Triton pass, 4 KiB per program.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    # 64-bit offsets: the tensor has 1.6 G elements.
    start = tl.program_id(0).to(tl.int64) * BLOCK
    offsets = start + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    tl.store(y_ptr + offsets, tl.maximum(x, 0.0), mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        y = torch.empty_like(x)
        n = x.numel()
        block = 4096
        relu_kernel[(triton.cdiv(n, block),)](x, y, n, BLOCK=block, num_warps=8)
        return y
