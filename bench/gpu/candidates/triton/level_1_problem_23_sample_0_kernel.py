# Level 1 problem 23 (softmax over dim 1 of a 4096 x 393216 fp32 tensor): one program per row, an online
# max-and-sum pass over the row in chunks, then a pass writing exp(x - max) / sum.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def softmax_rows(x_ptr, y_ptr, n_cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride
    y_row = y_ptr + row * stride
    cols = tl.arange(0, BLOCK)
    # fp32 scalars, so the loop carries one type.
    running_max = tl.max(tl.full((BLOCK,), -float("inf"), tl.float32), axis=0)
    running_sum = tl.sum(tl.zeros((BLOCK,), tl.float32), axis=0)
    for start in range(0, n_cols, BLOCK):
        mask = start + cols < n_cols
        x = tl.load(x_row + start + cols, mask=mask, other=-float("inf"))
        new_max = tl.maximum(running_max, tl.max(x, axis=0))
        # Rescale what was summed against the old maximum; masked lanes add exp(-inf) = 0.
        running_sum = running_sum * tl.exp(running_max - new_max) + tl.sum(tl.exp(x - new_max), axis=0)
        running_max = new_max
    inv = 1.0 / running_sum
    for start in range(0, n_cols, BLOCK):
        mask = start + cols < n_cols
        x = tl.load(x_row + start + cols, mask=mask, other=0.0)
        tl.store(y_row + start + cols, tl.exp(x - running_max) * inv, mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        y = torch.empty_like(x)
        rows, cols = x.shape
        softmax_rows[(rows,)](x, y, cols, x.stride(0), BLOCK=4096, num_warps=8)
        return y
