# A KernelBench-format level-1 problem (ReLU over a large random input), sized for a CPU benchmark:
# 128 x 393216 fp32 = 201 MB per input set (KernelBench's level-1 ReLU uses 4096 rows, 6.4 GB).
import torch
import torch.nn as nn


class Model(nn.Module):
    """Applies ReLU elementwise."""

    def __init__(self):
        super(Model, self).__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x)


batch_size = 128
dim = 393216


def get_inputs():
    x = torch.rand(batch_size, dim)
    return [x]


def get_init_inputs():
    return []
