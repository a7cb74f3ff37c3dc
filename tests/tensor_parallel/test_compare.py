"""Tests for multigpu.tensor_parallel.compare: the distance from the reference (15)."""

import torch

from multigpu.tensor_parallel import max_difference


def test_max_difference_is_infinite_for_a_missing_name_or_a_shape():
    a = {"w": torch.zeros(2, 2)}
    assert max_difference({"w": torch.full((2, 2), 0.5)}, a) == 0.5
    assert max_difference({}, a) == float("inf")
    assert max_difference({"w": torch.zeros(4)}, a) == float("inf")
