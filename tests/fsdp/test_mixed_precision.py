"""gather_parameters sends bf16 and fills the buffer with every rank's chunk cast;
reduce_gradient sums in float32 and divides by the world size: run on the ranks
of the package's launch (2 and 3)."""

import torch
from torch.testing import assert_close

from multigpu.costmodel import all_gather_bytes_per_rank, reduce_scatter_bytes_per_rank
from multigpu.zero import shard_of
from tests.fsdp.conftest import CAST_NUMEL


def test_casts_before_the_all_gather_and_reduces_in_float32(fsdp_runs):
    world_size, _, reports = fsdp_runs
    master = torch.linspace(-1, 1, CAST_NUMEL) / 3
    grads = [
        torch.randn(CAST_NUMEL, generator=torch.Generator().manual_seed(r)).to(
            torch.bfloat16
        )
        for r in range(world_size)
    ]
    mean = sum(g.double() for g in grads) / world_size
    for rank, (_, report) in enumerate(reports):
        assert torch.equal(report["full"], master.to(torch.bfloat16))
        assert report["gather_sent"] == all_gather_bytes_per_rank(
            CAST_NUMEL, 2, world_size, rank
        )
        assert report["shard_grad"].dtype == torch.float32
        expected = shard_of(mean, rank, world_size).float()
        assert_close(report["shard_grad"], expected, rtol=0, atol=1e-7)
        assert report["reduce_sent"] == reduce_scatter_bytes_per_rank(
            CAST_NUMEL, 4, world_size, rank
        )
        assert torch.equal(report["shard_after"], shard_of(master, rank, world_size))
