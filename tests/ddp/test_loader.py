"""The DistributedSampler deals like 08's partitioner, and pads."""

import pytest
import torch

from multigpu import ddp
from multigpu.core.sharding import batch_indices
from tests.ddp.problems import NUM_SAMPLES


def test_distributed_sampler_deals_like_the_hand_written_partitioner():
    world_size, seed, global_batch = 2, 3, 16
    dataset = torch.utils.data.TensorDataset(torch.arange(NUM_SAMPLES))
    steps = NUM_SAMPLES // global_batch
    for epoch in range(2):
        for rank in range(world_size):
            loader = ddp.distributed_loader(
                dataset, global_batch, rank, world_size, seed
            )
            loader.sampler.set_epoch(epoch)
            got = [batch[0] for batch in loader]
            expected = batch_indices(
                NUM_SAMPLES, global_batch, 2 * steps, world_size, rank, seed
            )[epoch * steps : (epoch + 1) * steps]
            assert [t.tolist() for t in got] == [t.tolist() for t in expected]


def test_sampler_pads_by_repeating_the_first_indices():
    shards = ddp.sampler_shards(10, 4)
    assert shards == [[0, 4, 8], [1, 5, 9], [2, 6, 0], [3, 7, 1]]
    exact = [ddp.exact_shard(10, r, 4).tolist() for r in range(4)]
    assert sorted(sum(exact, [])) == list(range(10))


def test_forgetting_set_epoch_repeats_the_same_order():
    sampler = torch.utils.data.distributed.DistributedSampler(
        range(8), num_replicas=2, rank=0, seed=0
    )
    forgotten = [list(sampler) for _ in range(3)]
    assert forgotten[0] == forgotten[1] == forgotten[2]
    remembered = []
    for epoch in range(3):
        sampler.set_epoch(epoch)
        remembered.append(list(sampler))
    assert remembered[0] != remembered[1]
    assert ddp.sampler_shards(8, 2, True, 0, epoch=1)[0] == remembered[1]


def test_loader_with_sampler_and_shuffle_raises():
    sampler = torch.utils.data.distributed.DistributedSampler(
        range(8), num_replicas=2, rank=0
    )
    with pytest.raises(ValueError, match="sampler option is mutually exclusive"):
        torch.utils.data.DataLoader(range(8), sampler=sampler, shuffle=True)
