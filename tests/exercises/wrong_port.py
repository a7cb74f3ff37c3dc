"""DDP ports of notebook 12's Horovod-style script that learners write, the right
one and each with one mistake; the ranks import them by name."""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from multigpu.core.models import ConvNet


def _train(
    rank,
    X,
    y,
    epochs,
    batch_size,
    wrap,
    sampler=True,
    by_hand=False,
    lr=0.1,
    divide=True,
    broadcast=False,
):
    torch.manual_seed(rank)
    inner = ConvNet().double()
    if broadcast:
        for tensor in inner.state_dict().values():
            dist.broadcast(tensor, src=0)
    model = DDP(inner) if wrap else inner
    dataset = TensorDataset(X, y)
    share = DistributedSampler(dataset, shuffle=False) if sampler else None
    loader = DataLoader(dataset, batch_size=batch_size, sampler=share)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    for epoch in range(epochs):
        if share is not None:
            share.set_epoch(epoch)
        for inputs, targets in loader:
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(inputs), targets).backward()
            if by_hand:  # average the gradients (or only sum them) by hand
                for p in inner.parameters():
                    dist.all_reduce(p.grad)
                    if divide:
                        p.grad /= dist.get_world_size()
            optimizer.step()
    return model


def _weights(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def right(rank, world_size, X, y, epochs=2, batch_size=32):
    return _weights(_train(rank, X, y, epochs, batch_size, wrap=True).module)


def by_hand_with_broadcast(rank, world_size, X, y, epochs=2, batch_size=32):
    """Correct too: no DDP, but rank 0's weights broadcast and gradients averaged."""
    model = _train(
        rank, X, y, epochs, batch_size, wrap=False, by_hand=True, broadcast=True
    )
    return _weights(model)


def not_wrapped(rank, world_size, X, y, epochs=2, batch_size=32):
    """The exercise's TODOs left as they are."""
    return _weights(_train(rank, X, y, epochs, batch_size, wrap=False))


def wrapper_state_dict(rank, world_size, X, y, epochs=2, batch_size=32):
    return _weights(_train(rank, X, y, epochs, batch_size, wrap=True))


def no_sampler(rank, world_size, X, y, epochs=2, batch_size=32):
    model = _train(rank, X, y, epochs, batch_size, wrap=True, sampler=False)
    return _weights(model.module)


def averaged_by_hand_without_broadcast(rank, world_size, X, y, epochs=2, batch_size=32):
    return _weights(_train(rank, X, y, epochs, batch_size, wrap=False, by_hand=True))


def lr_scaled(rank, world_size, X, y, epochs=2, batch_size=32):
    """Horovod's examples scale the learning rate by hvd.size(); this script does
    not."""
    model = _train(rank, X, y, epochs, batch_size, wrap=True, lr=0.1 * world_size)
    return _weights(model.module)


def lr_divided(rank, world_size, X, y, epochs=2, batch_size=32):
    model = _train(rank, X, y, epochs, batch_size, wrap=True, lr=0.1 / world_size)
    return _weights(model.module)


def summed_by_hand(rank, world_size, X, y, epochs=2, batch_size=32):
    """Broadcast rank 0's weights, then summed the gradients without dividing."""
    model = _train(
        rank,
        X,
        y,
        epochs,
        batch_size,
        wrap=False,
        by_hand=True,
        divide=False,
        broadcast=True,
    )
    return _weights(model)


def batch_scaled(rank, world_size, X, y, epochs=2, batch_size=32):
    """Took batch_size for the global batch and gave each rank world_size times it."""
    model = _train(rank, X, y, epochs, batch_size * world_size, wrap=True)
    return _weights(model.module)


def batch_divided(rank, world_size, X, y, epochs=2, batch_size=32):
    """Took batch_size for the global batch and split it between the ranks."""
    model = _train(rank, X, y, epochs, batch_size // world_size, wrap=True)
    return _weights(model.module)


def only_rank_0_wraps(rank, world_size, X, y, epochs=2, batch_size=32):
    """Wrapped the model on rank 0 only: the others never join its collectives."""
    model = _train(rank, X, y, epochs, batch_size, wrap=rank == 0)
    return _weights(model.module if rank == 0 else model)


def horovod_left_in(rank, world_size, X, y, epochs=2, batch_size=32):
    """Kept a Horovod call whose hvd.init() was removed."""
    import multigpu.horovod_api as hvd

    torch.manual_seed(hvd.rank())
    return _weights(_train(rank, X, y, epochs, batch_size, wrap=True).module)
