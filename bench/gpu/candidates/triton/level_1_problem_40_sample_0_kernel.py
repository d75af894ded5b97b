# Level 1 problem 40 (LayerNorm over the last three dims, 64 x 256 x 256 = 4 M elements per row, 16
# rows, with weight and bias): the rows are too long for one program each, so a first kernel sums x
# and x^2 over chunks of a row into per-row accumulators (fp32 atomics), and a second normalises
# every element with the row's mean and 1 / sqrt(var + eps) and applies weight and bias.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def row_moments(x_ptr, sums_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1).to(tl.int64)
    cols = chunk * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0)
    tl.atomic_add(sums_ptr + row * 2, tl.sum(x, axis=0))
    tl.atomic_add(sums_ptr + row * 2 + 1, tl.sum(x * x, axis=0))


@triton.jit
def normalize(x_ptr, w_ptr, b_ptr, sums_ptr, y_ptr, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1).to(tl.int64)
    cols = chunk * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    mean = tl.load(sums_ptr + row * 2) / n_cols
    var = tl.load(sums_ptr + row * 2 + 1) / n_cols - mean * mean
    rstd = 1.0 / tl.sqrt(var + eps)
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    b = tl.load(b_ptr + cols, mask=mask, other=0.0)
    tl.store(y_ptr + row * n_cols + cols, (x - mean) * rstd * w + b, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, normalized_shape: tuple):
        super().__init__()
        # nn.LayerNorm's parameters and their initial values (ones, zeros), and its default eps.
        self.weight = nn.Parameter(torch.ones(normalized_shape))
        self.bias = nn.Parameter(torch.zeros(normalized_shape))
        self.eps = 1e-5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        n_cols = self.weight.numel()
        rows = x.numel() // n_cols
        y = torch.empty_like(x)
        sums = torch.zeros((rows, 2), device=x.device, dtype=torch.float32)
        block = 4096
        grid = (rows, triton.cdiv(n_cols, block))
        row_moments[grid](x, sums, n_cols, BLOCK=block, num_warps=8)
        normalize[grid](
            x, self.weight.contiguous(), self.bias.contiguous(), sums, y, n_cols, self.eps,
            BLOCK=block, num_warps=8,
        )
        return y
