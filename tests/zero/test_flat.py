"""Tests for multigpu.zero.flat: the flat buffer of DDP, ZeRO-1 and ZeRO-2, which
holds the trainable parameters only (frozen ones stay out, a tied one once)."""

import pytest
import torch
from torch.nn import functional as F

from multigpu import zero
from tests.hard_cases import hard_case_data, hard_case_model, trainable_numel
from tests.zero.problem import model_and_data


def test_flatten_parameters_makes_the_model_a_view_of_one_buffer():
    model, X, y = model_and_data(sizes=(3, 2))
    before = model(X)
    flat = zero.flatten_parameters(model)
    assert flat.shape == (8,)  # 3*2 weights + 2 biases
    assert torch.equal(model(X), before)
    flat.zero_()
    assert torch.equal(model(X), torch.zeros_like(before))


def test_frozen_parameters_stay_out_of_the_flat_buffer():
    model = hard_case_model()
    frozen = model.frozen.weight.clone()
    flat = zero.flatten_parameters(model)
    assert flat.numel() == trainable_numel(model)  # a tied weight once, no frozen
    assert all(p.requires_grad for p in zero.trainable_parameters(model))
    flat.zero_()  # the trainable parameters are views of the buffer...
    assert torch.equal(model.embed.weight, torch.zeros_like(model.embed.weight))
    assert torch.equal(model.frozen.weight, frozen)  # ...the frozen one is not
    assert model.decode.weight is model.encode.weight  # still tied


def test_pop_flat_gradients_gives_zeros_for_a_parameter_without_gradient():
    model = hard_case_model()
    zero.flatten_parameters(model)
    X, y = hard_case_data()
    F.cross_entropy(model(X), y).backward()
    expected = [
        p.grad.reshape(-1) if p.grad is not None else torch.zeros(p.numel())
        for p in zero.trainable_parameters(model)
    ]
    assert model.unused.weight.grad is None and model.frozen.weight.grad is None
    gradients = zero.pop_flat_gradients(model)
    assert torch.equal(gradients, torch.cat(expected).double())
    assert all(p.grad is None for p in model.parameters())


def test_a_model_the_flat_buffer_cannot_hold_is_refused():
    model = hard_case_model().requires_grad_(False)
    with pytest.raises(ValueError) as error:
        zero.flatten_parameters(model)
    assert str(error.value) == (
        "TiedFrozenNet has no parameter that requires a gradient, so there is nothing "
        "to train. Unfreeze at least one parameter."
    )
    model = hard_case_model()
    model.head.float()
    with pytest.raises(ValueError) as error:
        zero.flatten_parameters(model)
    assert str(error.value) == (
        "TiedFrozenNet mixes parameter dtypes (torch.float32, torch.float64); one flat "
        "buffer holds one dtype. Convert the model first, e.g. model.double()."
    )
