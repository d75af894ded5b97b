import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Adds two vectors elementwise: out = a + b.
    """

    def __init__(self):
        super(Model, self).__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """
        Args:
            a (torch.Tensor): vector of shape (N,).
            b (torch.Tensor): vector of shape (N,).

        Returns:
            torch.Tensor: a + b, shape (N,).
        """
        return a + b


N = 1 << 20


def get_inputs():
    a = torch.randn(N)
    b = torch.randn(N)
    return [a, b]


def get_init_inputs():
    return []
