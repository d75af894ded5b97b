import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Applies ReLU elementwise.
    """

    def __init__(self):
        super(Model, self).__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """
        Args:
            x (torch.Tensor): input of shape (batch_size, dim).

        Returns:
            torch.Tensor: max(x, 0), same shape as x.
        """
        return torch.relu(x)


batch_size = 256
dim = 4096


def get_inputs():
    # Signed inputs (unlike KernelBench's U[0, 1) ReLU inputs), so the identity does not pass.
    x = torch.randn(batch_size, dim)
    return [x]


def get_init_inputs():
    return []
