"""Repeatable runs and stable printed numbers, used by every notebook.

``set_seed`` seeds every random number generator a run uses, in one place;
``round_sig`` rounds a float to a few significant digits, so that a printed number
is the same on every machine (stored notebook outputs are compared by the tests).
"""

from __future__ import annotations

import random

import numpy as np
import torch

__all__ = ["round_sig", "set_seed"]


def round_sig(value: float, digits: int = 4) -> float:
    """``value`` rounded to ``digits`` significant digits, for stable printing."""
    return float(f"{value:.{digits}g}")


def set_seed(seed: int = 0) -> None:
    """Seed Python, NumPy and PyTorch (CPU and every GPU) in one place (01)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device
