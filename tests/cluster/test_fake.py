"""Tests for multigpu.cluster.fake: a fake group of 1,024 (and 4,096) ranks builds
a mesh, runs FSDP2 x TP and moves nothing; CommDebugMode's counts of one step
equal the formula (2 all-gathers and 1 reduce-scatter per block for FSDP2; 2
all-reduces per block for TP, less the first block's input gradient)."""

import pytest
import torch
import torch.distributed as dist

from multigpu.cluster.fake import count_collectives, fake_world, mlp_step_collectives


def mlp_formula(blocks, dp, tp):
    counts = {}
    if dp > 1:
        counts["all-gather (FSDP)"] = 2 * blocks  # forward and backward
        counts["reduce-scatter (FSDP)"] = blocks
    if tp > 1:
        counts["all-reduce (TP)"] = blocks + (blocks - 1)
    return dict(sorted(counts.items()))


@pytest.mark.parametrize(
    "mesh_shape, blocks",
    [((128, 8), 2), ((512, 8), 3), ((2, 2), 1), ((4, 1), 2), ((1, 4), 2)],
)
def test_one_step_issues_the_collectives_of_the_formula(mesh_shape, blocks):
    assert mlp_step_collectives(mesh_shape, blocks) == mlp_formula(blocks, *mesh_shape)


def test_a_fake_all_reduce_returns_at_once_and_moves_nothing():
    with fake_world(1024, rank=5):
        assert (dist.get_rank(), dist.get_world_size()) == (5, 1024)
        values = torch.full((2,), 3.0)
        assert count_collectives(lambda: dist.all_reduce(values)) == {"all-reduce": 1}
        assert values.tolist() == [3.0, 3.0]  # a real sum would be 3 * 1024
    assert not dist.is_initialized()


def test_a_second_group_is_refused_in_one_line():
    with fake_world(4):
        with pytest.raises(RuntimeError, match="destroy it") as error:
            with fake_world(8):
                pass
        assert "\n" not in str(error.value)
    assert not dist.is_initialized()
