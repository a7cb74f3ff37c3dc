"""Comparing runs: how far two trainings' weights are apart (08 on)."""

from __future__ import annotations

import torch


def max_parameter_difference(
    a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]
) -> float:
    """Largest absolute difference between two state_dicts with the same keys (08)."""
    if a.keys() != b.keys():
        raise ValueError(
            "The two state_dicts have different keys. Compare parameters of the "
            "same model architecture."
        )
    if not a:
        raise ValueError(
            "The two state_dicts are empty: there are no parameters to compare. "
            "Pass the results' .parameters after training."
        )
    return max((a[name] - b[name]).abs().max().item() for name in a)
