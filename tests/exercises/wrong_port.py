"""DDP ports of notebook 12's Horovod-style script that learners write, the right
one and each with one mistake; the ranks import them by name."""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from multigpu.core.models import ConvNet


def _train(rank, X, y, epochs, batch_size, wrap, sampler=True, by_hand=False):
    torch.manual_seed(rank)
    inner = ConvNet().double()
    model = DDP(inner) if wrap else inner
    dataset = TensorDataset(X, y)
    share = DistributedSampler(dataset, shuffle=False) if sampler else None
    loader = DataLoader(dataset, batch_size=batch_size, sampler=share)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(epochs):
        if share is not None:
            share.set_epoch(epoch)
        for inputs, targets in loader:
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(inputs), targets).backward()
            if by_hand:  # average the gradients, but nothing broadcast the weights
                for p in inner.parameters():
                    dist.all_reduce(p.grad)
                    p.grad /= dist.get_world_size()
            optimizer.step()
    return model


def _weights(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def right(rank, world_size, X, y, epochs=2, batch_size=32):
    return _weights(_train(rank, X, y, epochs, batch_size, wrap=True).module)


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
