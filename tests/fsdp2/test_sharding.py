"""Tests for multigpu.fsdp2.sharding (through the ranks of multigpu.ranks.fsdp2):
HSDP's placements, meta-device construction (bytes per rank; what differs from one
process, and how the one-process weights get in), the full state dict exported by
rank 0 into a plain model, PyTorch's ZeRO-1 beside 13's, and what FSDP2 refuses."""

import pytest
import torch
from torch import nn

from multigpu import fsdp2
from multigpu.core.models import TiedFrozenNet
from multigpu.costmodel.fsdp2 import shard_numel
from tests.fsdp2.problem import LR, global_steps
from tests.hard_cases import hard_case_model, trainable_numel


def test_hsdp_replicates_over_one_dimension_and_shards_over_the_other(world4):
    for result in world4["hsdp"]:
        assert set(result["placements"].values()) == {"(Replicate(), Shard(dim=0))"}
        # all-gathers and reduce-scatters within a group of 2, all-reduces across
        assert result["group sizes"] == {
            "all-gather": [2],
            "reduce-scatter": [2],
            "all-reduce": [2],
        }


def test_meta_init_allocates_only_this_ranks_shards(world4, world2):
    model = TiedFrozenNet()
    for world_size, results in ((4, world4["meta"]), (2, world2["meta"])):
        for result in results:
            assert result["meta bytes"] == 0  # built on meta: nothing allocated
            padded = sum(shard_numel(p.shape, world_size) for p in model.parameters())
            assert result["stored bytes"] == padded * 4
            assert (
                result["whole bytes"] == sum(p.numel() for p in model.parameters()) * 4
            )
        # every rank allocates the padded shard: ceil(rows / N) rows of each
        assert len({result["stored bytes"] for result in results}) == 1


def test_meta_init_on_cpu_is_not_one_process_init_but_loading_is(world4, world2):
    for result in world4["meta"] + world2["meta"]:
        # CPU meshes have no DTensor RNG (torch/distributed/tensor/_random.py): every
        # rank draws its own rows from the same seed, so ranks get the same rows
        assert not any(result["reset equals one process"].values())
        assert result["ranks drew the same rows"]
        assert result["loaded equals one process"]  # broadcast from rank 0


def test_full_state_dict_is_on_rank_0_and_loads_into_a_plain_model(world4):
    first, *others = world4["export"]
    model = hard_case_model()
    expected = sorted(model.state_dict())  # buffer and tied alias included
    assert first["keys"] == expected and first["types"] == ["Tensor"]
    assert first["devices"] == ["cpu"]  # cpu_offload=True
    assert all(other["keys"] == [] for other in others)
    model.load_state_dict(torch.load(world4["export path"]))
    trained = first["parameters"]
    for name, parameter in model.named_parameters():
        assert torch.equal(parameter, trained[name])
    X = global_steps()[0][0][0]
    plain = fsdp2.train_one_process(hard_case_model(seed=1), global_steps(), LR)
    fresh = hard_case_model()
    fresh.load_state_dict(plain.parameters, strict=False)
    assert torch.allclose(model(X), fresh(X), rtol=0, atol=1e-12)  # equal outputs


def test_zero_redundancy_optimizer_equals_13s_zero1_and_one_process(world4):
    reference = fsdp2.train_one_process(hard_case_model(seed=1), global_steps(), LR)
    model = hard_case_model()
    for result in world4["zero"]:
        for name in reference.parameters:
            assert (result["torch"][name] - result["13"][name]).abs().max() <= 1e-12
            assert (
                result["torch"][name] - reference.parameters[name]
            ).abs().max() <= 1e-12
    unused = sum(p.numel() for p in model.unused.parameters())
    ours = sum(r["13 adam bytes"] for r in world4["zero"])
    theirs = sum(r["torch adam bytes"] for r in world4["zero"])
    assert ours == 2 * trainable_numel(model) * 8  # every trainable number, once
    assert theirs == 2 * (trainable_numel(model) - unused) * 8  # no state without grad


def test_fully_shard_refuses_a_tied_weight_split_between_two_units(world4):
    assert set(world4["tied"]) == {
        "ValueError: Parameter 'decode.weight' is shared with a parameter already "
        "managed by another FSDP group. For shared/tied parameters, use "
        "fully_shard([module_a, module_b]) to place them in the same FSDP group."
    }


def test_layers_to_shard_leaves_tied_layers_to_the_root():
    model = hard_case_model()
    layers = fsdp2.layers_to_shard(model)
    assert layers == [model.embed, model.frozen, model.head, model.unused]
    assert fsdp2.layers_to_shard(nn.Sequential(nn.ReLU())) == []


def test_set_prefetch_refuses_a_negative_depth():
    with pytest.raises(ValueError) as error:
        fsdp2.set_prefetch([], -1)
    assert str(error.value) == "depth must be 0 or more, got -1. Pass e.g. depth=1."
