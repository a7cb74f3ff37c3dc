"""Tests for multigpu.tensor_parallel.memory: the activation bytes each rank saves
equal the formula, region by region, under TP and SP (15)."""

import torch

from multigpu.costmodel.tensor_parallel import tp_activation_bytes
from multigpu.tensor_parallel import Block, saved_activation_bytes
from tests.tensor_parallel.problem import SHAPE


def test_measured_activations_equal_the_formula(launched):
    world_size, results = launched
    for name, sequence_parallel in (("tp", False), ("sp", True)):
        formula = tp_activation_bytes(
            2,
            8,
            SHAPE["hidden"],
            SHAPE["ffn"],
            SHAPE["heads"],
            world_size,
            sequence_parallel,
            8,
        )
        for result in results[name]:
            assert result["activation_bytes"] == sum(formula.values()), name


def test_sequence_parallel_saves_less_from_two_ranks_on(launched):
    world_size, results = launched
    tp, sp = results["tp"][0], results["sp"][0]
    if world_size == 1:
        assert sp["activation_bytes"] == tp["activation_bytes"]
    else:
        assert sp["activation_bytes"] < tp["activation_bytes"]


def test_parameters_and_unsaved_tensors_are_not_counted():
    torch.manual_seed(0)
    linear = torch.nn.Linear(4, 3).double()
    x = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    with saved_activation_bytes(linear) as saved:
        linear(x)  # saves x (its weight is a parameter)
    assert sum(saved.values()) == 5 * 4 * 8
    with saved_activation_bytes(Block(8, 4, 16)) as saved:
        with torch.no_grad():
            Block(8, 4, 16)(torch.randn(1, 2, 8))
    assert saved == {}
