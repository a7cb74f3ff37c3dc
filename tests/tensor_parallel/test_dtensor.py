"""Tests for multigpu.tensor_parallel.dtensor: PyTorch's parallelize_module equals
one process and the hand-built block, on CPU with gloo; loss_parallel equals the
full cross-entropy; 2-D (FSDP2 x TP on a 2x2 mesh) trains like one process (15)."""

import pytest
import torch
from torch.nn import functional as F

from multigpu.tensor_parallel import (
    max_difference,
    one_process_block,
    one_process_sgd,
    sequence_chunk,
)
from multigpu.tensor_parallel.dtensor import (
    block_plan,
    mlp_plan,
    sequence_parallel_plan,
)
from tests.tensor_parallel.problem import EXACT, block_and_data, lm_and_data


@pytest.mark.parametrize(("name", "sp"), [("dtensor tp", False), ("dtensor sp", True)])
def test_dtensor_block_equals_one_process_and_the_hand_built_one(launched, name, sp):
    world_size, results = launched
    block, x, grad_out = block_and_data()
    reference = one_process_block(block, x, grad_out)
    for rank, result in enumerate(results[name]):
        cut = (
            sequence_chunk(reference["out"], rank, world_size)
            if sp
            else reference["out"]
        )
        assert (result["out"] - cut).abs().max().item() < EXACT
        assert max_difference(result["grads"], reference["grads"]) < EXACT
        hand_built = results["sp" if sp else "tp"][rank]
        assert (result["out"] - hand_built["out"]).abs().max().item() < EXACT
        assert (result["x_grad"] - hand_built["x_grad"]).abs().max().item() < EXACT


def test_sequence_parallel_layer_norm_gradients_are_partial_sums(launched):
    world_size, results = launched
    placements = results["dtensor sp"][0]["placements"]
    assert placements["ln1.weight"] == "(Partial(sum),)"
    assert placements["attn.q.weight"] == "(Shard(dim=0),)"
    assert placements["mlp.fc2.weight"] == "(Shard(dim=1),)"
    assert results["dtensor tp"][0]["placements"]["ln1.weight"] == "plain tensor"


def test_loss_parallel_equals_the_hand_built_loss_and_one_process(launched):
    world_size, results = launched
    lm, tokens, target = lm_and_data()
    F.cross_entropy(lm(tokens).flatten(0, 1), target.flatten()).backward()
    grads = {name: p.grad for name, p in lm.named_parameters()}
    for rank, result in enumerate(results["dtensor lm"]):
        assert max_difference(result["grads"], grads) < EXACT
        assert result["placements"] == "(Shard(dim=2),)"
        assert result["local_shape"] == (2, 8, 16 // world_size)
        hand_built = results["lm"][rank]["loss"]
        assert abs(result["loss"].item() - hand_built.item()) < EXACT


def test_two_d_fsdp2_and_tp_train_like_one_process(launched):
    world_size, results = launched
    if world_size != 4:
        pytest.skip("the 2x2 mesh needs 4 ranks")
    block, _, _ = block_and_data()
    generator = torch.Generator().manual_seed(5)
    X = torch.randn(4, 8, 8, generator=generator, dtype=torch.float64)
    Y = torch.randn(4, 8, 8, generator=generator, dtype=torch.float64)
    reference = one_process_sgd(block, X, Y, 3, 0.1)
    coordinates = []
    for result in results["2-D"]:
        assert max_difference(result["parameters"], reference) < EXACT
        coordinates.append(result["coordinates"])
    assert coordinates == [(0, 0), (0, 1), (1, 0), (1, 1)]


def test_the_sequence_parallel_plan_adds_layer_norms_and_input_gathers():
    plain, sequence = block_plan(), block_plan(sequence_parallel=True)
    assert set(sequence) - set(plain) == {"ln1", "ln2", "attn", "mlp"}
    assert type(plain["attn.q"]).__name__ == "ColwiseParallel"
    assert type(plain["mlp.fc2"]).__name__ == "RowwiseParallel"
    assert type(sequence["ln1"]).__name__ == "SequenceParallel"


def test_the_block_plan_joins_the_attention_the_mlp_and_the_sequence_plan():
    for sequence_parallel in (False, True):
        plan = block_plan("block.", sequence_parallel)
        mlp = mlp_plan("block.mlp.", sequence_parallel)
        assert {name: type(style) for name, style in mlp.items()} == {
            name: type(plan[name]) for name in mlp
        }
        fc2 = plan["block.mlp.fc2"]
        assert str(fc2.output_layouts[0]) == ("S(1)" if sequence_parallel else "R")
    extra = set(block_plan("block.", True)) - set(block_plan("block."))
    assert extra == set(sequence_parallel_plan("block."))
