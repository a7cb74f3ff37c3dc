"""The hard cases, cut into a pipeline: HardCaseNet's layers (a weight tied between
two modules, a frozen layer, a buffer) and a module with a parameter unused in
forward, as an nn.Sequential of 8 modules, with the 41 samples of
tests/hard_cases.py (no micro-batch count from 2 to 8 divides 41)."""

import torch
from torch import nn

from multigpu.pipeline import Scale
from tests.hard_cases import hard_case_data, hard_case_model


class WithUnused(nn.Module):
    """tanh, plus a parameter that forward never reads."""

    def __init__(self) -> None:
        super().__init__()
        self.unused = nn.Parameter(torch.ones(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x)


def hard_sequential(
    dtype: torch.dtype = torch.float64, tied_across: bool = False
) -> nn.Sequential:
    """embed, tanh | frozen, tanh (+ unused) | encode, decode (tied) | scale (a
    buffer), head: 2 + 2 + 2 + 2 modules, so that on 2 or 4 stages the tied pair
    falls in one stage; ``tied_across`` moves encode to stage 0 of 2."""
    net = hard_case_model(dtype)
    middle = [net.frozen, WithUnused().to(dtype), net.encode, net.decode]
    if tied_across:
        middle = [net.frozen, net.encode, WithUnused().to(dtype), net.decode]
    return nn.Sequential(net.embed, nn.Tanh(), *middle, Scale(), net.head)


def data(dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    """The 41 hard-case samples."""
    return hard_case_data(dtype=dtype)
