"""Evaluations that learners really write for notebook 09's exercise 4, each with
one mistake; the ranks import them from here (tests/exercises/test_ddp_evaluation)."""

import math

import torch
import torch.distributed as dist
from torch.nn.functional import cross_entropy
from torch.utils.data.distributed import DistributedSampler


def _sums(model, X, y, indices):
    """[sum of losses, correct, count] over ``indices`` as a float64 tensor."""
    with torch.no_grad():
        logits = model(X[indices])
    loss = cross_entropy(logits, y[indices], reduction="sum")
    correct = (logits.argmax(1) == y[indices]).sum()
    return torch.stack([loss, correct.double(), torch.tensor(len(indices)).double()])


def _exact_shard(y):
    return torch.arange(dist.get_rank(), len(y), dist.get_world_size())


def whole_set_on_every_rank(model, X, y):
    """Mistake: every rank evaluates every sample (the exercise's skeleton)."""
    sums = _sums(model, X, y, torch.arange(len(y)))
    return (sums[0] / sums[2]).item(), (sums[1] / sums[2]).item()


def mean_of_rank_means(model, X, y):
    """Mistake: averages the ranks' means although the shards differ in size."""
    sums = _sums(model, X, y, _exact_shard(y))
    means = sums[:2] / sums[2]
    dist.all_reduce(means)
    means /= dist.get_world_size()
    return means[0].item(), means[1].item()


def padded_sampler(model, X, y):
    """Mistake: DistributedSampler's padded shard, so repeated samples count twice."""
    sampler = DistributedSampler(
        range(len(y)), dist.get_world_size(), dist.get_rank(), shuffle=False
    )
    sums = _sums(model, X, y, torch.tensor(list(sampler)))
    dist.all_reduce(sums)
    return (sums[0] / len(y)).item(), (sums[1] / len(y)).item()


def divided_by_padded_total(model, X, y):
    """Mistake: exact shards, but divides by world_size x ceil(N / world_size)."""
    sums = _sums(model, X, y, _exact_shard(y))
    dist.all_reduce(sums)
    total = dist.get_world_size() * math.ceil(len(y) / dist.get_world_size())
    return (sums[0] / total).item(), (sums[1] / total).item()


def no_all_reduce(model, X, y):
    """Mistake: no all-reduce, so every rank (rank 0 too) reports its own shard."""
    sums = _sums(model, X, y, _exact_shard(y))
    return (sums[0] / sums[2]).item(), (sums[1] / sums[2]).item()


def drops_the_remainder(model, X, y):
    """Mistake: N // world_size samples per rank, so the last N mod W are dropped."""
    per_rank = len(y) // dist.get_world_size()
    sums = _sums(model, X, y, _exact_shard(y)[:per_rank])
    dist.all_reduce(sums)
    return (sums[0] / sums[2]).item(), (sums[1] / sums[2]).item()


def returns_a_dict(model, X, y):
    """Mistake: right numbers, wrong shape of result."""
    sums = _sums(model, X, y, _exact_shard(y))
    dist.all_reduce(sums)
    return {"loss": (sums[0] / sums[2]).item()}
