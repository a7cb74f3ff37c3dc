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


def all_reduce_on_rank_0_only(model, X, y):
    """Mistake: the all-reduce sits under ``if rank == 0``: rank 0 waits in it for
    ranks that never call it."""
    sums = _sums(model, X, y, _exact_shard(y))
    if dist.get_rank() == 0:
        dist.all_reduce(sums)
    return (sums[0] / sums[2]).item(), (sums[1] / sums[2]).item()


def raises(model, X, y):
    """Mistake: indexes with a float tensor, which PyTorch refuses."""
    shard = torch.arange(dist.get_rank(), len(y), dist.get_world_size()).double()
    return _sums(model, X, y, shard)


# ----------------------------------------------------------------------------------
# Exercise 3: the learner's DDP script, run as spawn's rank function, right and with
# each common mistake; rank 0 returns the final weights.

SCRIPT_MISTAKES = ("none", "no set_epoch", "per-rank batch", "no sampler")


def ddp_script_rank(rank, world_size, mistake="none"):
    """The body of exercise 3's script (the solution's), with ``mistake``."""
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, TensorDataset

    from multigpu.core.data import get_dataset, tensors
    from multigpu.core.models import ConvNet
    from multigpu.core.reproducibility import set_seed

    set_seed(0)
    model = DistributedDataParallel(ConvNet().double())
    X, y = tensors(get_dataset("digits", train=True))
    dataset = TensorDataset(X[:256].double(), y[:256])
    batch = 64 if mistake == "per-rank batch" else 64 // world_size
    if mistake == "no sampler":
        sampler = None
        loader = DataLoader(dataset, batch_size=batch, shuffle=True, drop_last=True)
    else:
        sampler = DistributedSampler(dataset, shuffle=True, seed=0, drop_last=True)
        loader = DataLoader(dataset, batch_size=batch, sampler=sampler, drop_last=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for epoch in range(2):
        if sampler is not None and mistake != "no set_epoch":
            sampler.set_epoch(epoch)
        for xb, yb in loader:
            optimizer.zero_grad()
            cross_entropy(model(xb), yb).backward()
            optimizer.step()
    return {key: value.clone() for key, value in model.module.state_dict().items()}
