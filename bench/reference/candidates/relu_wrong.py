# Wrong values in every trial (off by 0.1 %): KernelBench checks all five trials.
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.relu(x) * 1.001
