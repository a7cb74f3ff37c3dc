"""Tests for the pieces of multigpu.expert_parallel that need no process group: the
experts per rank (and the refusal by name), the EP x DP layout's groups, which
parameters are an expert's, the start the ranks agree on, undoing a sort, and
replicas that disagree."""

import pytest
import torch

from multigpu.expert_parallel import (
    EPLayout,
    StepHistory,
    assemble_start,
    experts_per_rank,
    inverse_permutation,
    is_expert_parameter,
    make_moe_classifier,
    merge_parameters,
)


def test_experts_per_rank_and_the_refusal():
    assert experts_per_rank(8, 4) == 2 and experts_per_rank(4, 1) == 4
    with pytest.raises(ValueError) as error:
        experts_per_rank(6, 4)
    assert str(error.value) == (
        "6 experts cannot be split evenly over 4 expert-parallel ranks: each rank "
        "must hold the same number of experts. Use a number of experts divisible by "
        "4, or an expert-parallel size that divides 6."
    )


def test_the_layout_groups_consecutive_ranks_and_their_replicas():
    layout = EPLayout((0, 1, 2, 3, 4, 5), ep_size=3)
    assert layout.dp_size == 2
    assert layout.ep_groups() == [(0, 1, 2), (3, 4, 5)]
    assert layout.expert_dp_groups() == [(0, 3), (1, 4), (2, 5)]
    assert EPLayout((2, 3), 2).expert_dp_groups() == [(2,), (3,)]  # dp = 1
    with pytest.raises(ValueError, match="4 ranks cannot be cut into expert-parallel"):
        EPLayout((0, 1, 2, 3), 3)


def test_expert_parameters_by_name():
    names = [name for name, _ in make_moe_classifier().named_parameters()]
    experts = [name for name in names if is_expert_parameter(name)]
    assert len(experts) == 4 * 4  # 4 experts, fc1 and fc2, weight and bias
    assert all(name.startswith("moe.experts.") for name in experts)
    assert not is_expert_parameter("moe.router.weight")
    assert is_expert_parameter("experts.3.fc1.weight")  # the layer's own names


def test_the_start_takes_the_dense_part_from_rank_0_and_each_expert_from_its_rank():
    models = [make_moe_classifier(seed=seed) for seed in range(4)]
    start = assemble_start(models, ep_size=2)  # experts 0-1 on rank 0, 2-3 on rank 1
    assert torch.equal(start.head.weight, models[0].head.weight)
    assert torch.equal(start.moe.router.weight, models[0].moe.router.weight)
    for expert, rank in ((0, 0), (1, 0), (2, 1), (3, 1)):
        ours = start.moe.experts[expert].fc1.weight
        assert torch.equal(ours, models[rank].moe.experts[expert].fc1.weight)
    assert not torch.equal(
        models[0].moe.experts[2].fc1.weight, models[1].moe.experts[2].fc1.weight
    )


def test_inverse_permutation_undoes_a_sort():
    keys = torch.tensor([3, 0, 2, 0, 1])
    order = torch.argsort(keys, stable=True)
    assert torch.equal(keys[order][inverse_permutation(order)], keys)
    assert inverse_permutation(torch.tensor([], dtype=torch.int64)).numel() == 0


def test_replicas_that_differ_are_refused_when_merged():
    same = StepHistory(parameters={"head.weight": torch.ones(2)})
    other = StepHistory(parameters={"head.weight": torch.zeros(2)})
    merged = merge_parameters([{"history": same}, None, {"history": same}])
    assert torch.equal(merged["head.weight"], torch.ones(2))
    with pytest.raises(ValueError, match="The replicas of head.weight differ"):
        merge_parameters([{"history": same}, {"history": other}])
