import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Sums each row of a matrix, keeping the reduced dimension.
    """

    def __init__(self):
        super(Model, self).__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """
        Args:
            x (torch.Tensor): input of shape (rows, cols).

        Returns:
            torch.Tensor: row sums, shape (rows, 1).
        """
        return torch.sum(x, dim=1, keepdim=True)


rows = 1024
cols = 1024


def get_inputs():
    x = torch.randn(rows, cols)
    return [x]


def get_init_inputs():
    return []
