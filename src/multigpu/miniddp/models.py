"""The model of the unused-parameter case (10)."""

from __future__ import annotations

import torch
from torch import nn


class BranchNet(nn.Module):
    """A trunk and two heads; ``forward(x, use_b)`` adds head ``b`` only when asked,
    so its parameters get no gradient otherwise: the unused-parameter case (10)."""

    def __init__(self, features: int = 8, classes: int = 3) -> None:
        super().__init__()
        self.trunk = nn.Linear(features, features)
        self.head_a = nn.Linear(features, classes)
        self.head_b = nn.Linear(features, classes)

    def forward(self, x: torch.Tensor, use_b: bool = False) -> torch.Tensor:
        h = torch.relu(self.trunk(x))  # x: (batch, features)
        out = self.head_a(h)
        return out + self.head_b(h) if use_b else out  # (batch, classes)
