import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Per-feature affine map: out = x * scale + bias, with learnable scale and bias of shape (features,).
    """

    def __init__(self, features: int):
        super(Model, self).__init__()
        self.scale = nn.Parameter(torch.randn(features))
        self.bias = nn.Parameter(torch.randn(features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """
        Args:
            x (torch.Tensor): input of shape (batch_size, features).

        Returns:
            torch.Tensor: x * scale + bias, shape (batch_size, features).
        """
        return x * self.scale + self.bias


batch_size = 1024
features = 1024


def get_inputs():
    x = torch.randn(batch_size, features)
    return [x]


def get_init_inputs():
    return [features]
