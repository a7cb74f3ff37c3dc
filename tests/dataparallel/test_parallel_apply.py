"""parallel_apply: its checks, like PyTorch's."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from multigpu import dataparallel as dp


def test_parallel_apply_checks_lengths_like_pytorch():
    layer = nn.Linear(1, 1)
    with pytest.raises(AssertionError, match="number of modules 2 is not equal to the"):
        dp.parallel_apply([layer, layer], [torch.ones(1, 1)])
    with pytest.raises(AssertionError, match="the number of kwargs_tup 1"):
        dp.parallel_apply([layer, layer], [torch.ones(1, 1)] * 2, [{}])
    with pytest.raises(AssertionError, match="the number of devices 3"):
        dp.parallel_apply([layer, layer], [torch.ones(1, 1)] * 2, None, ["gpu:0"] * 3)
    with pytest.raises(RuntimeError, match="no tensor input was found"):
        dp.parallel_apply([layer, layer], [(), ()])
