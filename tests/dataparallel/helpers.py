"""Small models shared by the tests of multigpu.dataparallel."""

import torch
from torch import nn

from multigpu import dataparallel as dp
from multigpu.core.models import ConvNet


def small_model():
    torch.manual_seed(0)
    return ConvNet(in_channels=1, num_classes=10, width=4)


def tiny_model(devices):
    """Linear(3, 5) -> ReLU -> Linear(5, 2): 32 parameters, 128 bytes."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 2))
    return dp.to_device(model, devices[0])
