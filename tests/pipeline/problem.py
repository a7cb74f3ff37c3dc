"""The hard cases a pipeline takes (tests/hard_cases.py: those the registry says it
trains like one process), each as the nn.Sequential of its layers that the registry
gives, and the 41 samples of the registry (no micro-batch count from 2 to 8 divides
41). ``hard_sequential`` is TiedFrozenNet's: a weight tied between two modules, a
frozen layer, a buffer and a parameter unused in forward, in 8 modules."""

import torch

from tests.hard_cases import cases_for, hard_case_data
from tests.hard_cases import hard_case_sequential as hard_sequential

PIPELINE_CASES = cases_for("pipeline")

__all__ = ["PIPELINE_CASES", "data", "hard_sequential"]


def data(dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    """The 41 hard-case samples."""
    return hard_case_data(dtype=dtype)
