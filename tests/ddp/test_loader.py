"""The DistributedSampler deals like 08's partitioner, and pads."""

import math

import pytest
import torch

from multigpu import ddp
from multigpu.core.batches import batch_indices
from multigpu.core.data import epoch_order
from tests.ddp.problems import HARD_BATCH, NUM_SAMPLES
from tests.hard_cases import NUM_SAMPLES as HARD_SAMPLES


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


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_loader_on_indivisible_data_gives_one_process_s_batches(world_size):
    # 41 samples: no full global batch divides them; every step is a full global
    # batch of distinct samples, N // global_batch of them, 08's batches exactly
    global_batch, seed = HARD_BATCH[world_size], 3
    dataset = torch.utils.data.TensorDataset(torch.arange(HARD_SAMPLES))
    steps = HARD_SAMPLES // global_batch
    for epoch in range(2):
        by_rank = []
        for rank in range(world_size):
            loader = ddp.distributed_loader(
                dataset, global_batch, rank, world_size, seed
            )
            loader.sampler.set_epoch(epoch)
            got = [batch[0].tolist() for batch in loader]
            expected = batch_indices(
                HARD_SAMPLES, global_batch, 2 * steps, world_size, rank, seed
            )[epoch * steps : (epoch + 1) * steps]
            assert got == [t.tolist() for t in expected]
            by_rank.append(got)
        order = epoch_order(HARD_SAMPLES, seed, epoch)
        for step in range(steps):  # the ranks' k-th batches: one process's k-th
            together = sorted(sum((got[step] for got in by_rank), []))
            one = order[step * global_batch : (step + 1) * global_batch]
            assert together == sorted(one.tolist())


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_padded_sampler_is_the_epoch_order_padded_with_its_first_indices(world_size):
    global_batch, seed, epoch = HARD_BATCH[world_size], 3, 1
    order = epoch_order(HARD_SAMPLES, seed, epoch)
    shard = math.ceil(HARD_SAMPLES / world_size)
    padded = torch.cat([order, order[: shard * world_size - HARD_SAMPLES]])
    shards = ddp.sampler_shards(HARD_SAMPLES, world_size, True, seed, epoch)
    assert shards == [padded[rank::world_size].tolist() for rank in range(world_size)]
    dataset = torch.utils.data.TensorDataset(torch.arange(HARD_SAMPLES))
    loader = ddp.distributed_loader(
        dataset, global_batch, 0, world_size, seed, padded_sampler=True
    )
    per_rank = global_batch // world_size
    assert len(loader) == shard // per_rank == HARD_SAMPLES // global_batch + 1
