"""Tests for multigpu.zero.flat: the flat buffer of DDP, ZeRO-1 and ZeRO-2."""

import torch

from multigpu import zero
from tests.zero.problem import model_and_data


def test_flatten_parameters_makes_the_model_a_view_of_one_buffer():
    model, X, y = model_and_data(sizes=(3, 2))
    before = model(X)
    flat = zero.flatten_parameters(model)
    assert flat.shape == (8,)  # 3*2 weights + 2 biases
    assert torch.equal(model(X), before)
    flat.zero_()
    assert torch.equal(model(X), torch.zeros_like(before))
