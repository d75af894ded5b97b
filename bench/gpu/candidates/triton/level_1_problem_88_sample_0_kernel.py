# Level 1 problem 88 (MinGPT's tanh GELU over an 8192 x 8192 fp32 tensor): the reference's seven
# element-wise PyTorch ops fused into one Triton pass. tanh(u) is written as 1 - 2 / (exp(2u) + 1),
# which Triton has in every version.
import math

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def gelu_kernel(x_ptr, y_ptr, n, SQRT_2_OVER_PI: tl.constexpr, BLOCK: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    u = SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)
    tanh_u = 1.0 - 2.0 / (tl.exp(2.0 * u) + 1.0)
    tl.store(y_ptr + offsets, 0.5 * x * (1.0 + tanh_u), mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        y = torch.empty_like(x)
        n = x.numel()
        block = 2048
        gelu_kernel[(triton.cdiv(n, block),)](
            x, y, n, SQRT_2_OVER_PI=math.sqrt(2.0 / math.pi), BLOCK=block, num_warps=8
        )
        return y
