"""The lesson's model: a small ``nn.Sequential`` with a buffer and a frozen
layer, deep enough to cut into 4 stages (16)."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["Scale", "make_pipeline_data", "make_pipeline_mlp"]


class Scale(nn.Module):
    """Multiplies by a buffer (not a parameter): read in forward, never trained."""

    def __init__(self, value: float = 0.5) -> None:
        super().__init__()
        self.register_buffer("factor", torch.tensor(value))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.factor


def make_pipeline_mlp(
    width: int = 16,
    in_features: int = 6,
    classes: int = 3,
    dtype: torch.dtype = torch.float64,
    seed: int = 0,
) -> nn.Sequential:
    """8 modules: Linear, Tanh, Linear (frozen), Tanh, Linear, Tanh, Scale (a
    buffer), Linear; cut into 2 stages 4 + 4, into 4 stages 2 + 2 + 2 + 2."""
    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Linear(in_features, width),
        nn.Tanh(),
        nn.Linear(width, width),
        nn.Tanh(),
        nn.Linear(width, width),
        nn.Tanh(),
        Scale(),
        nn.Linear(width, classes),
    ).to(dtype)
    model[2].requires_grad_(False)  # a frozen layer: its gradient stays None
    return model


def make_pipeline_data(
    num_samples: int = 41, in_features: int = 6, classes: int = 3, seed: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """X (num_samples, in_features) float64 and labels y (num_samples,)."""
    generator = torch.Generator().manual_seed(seed)
    X = torch.randn(num_samples, in_features, generator=generator, dtype=torch.float64)
    y = torch.randint(0, classes, (num_samples,), generator=generator)
    return X, y
