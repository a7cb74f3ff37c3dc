"""Training steps that learners write in notebook 08's exercise, each with one
mistake; the ranks import them by name (tests/exercises/test_allreduce_sgd.py).
Each has sgd_step's signature."""

import torch
import torch.distributed as dist
from torch.nn.functional import cross_entropy


def zero_grad_between_backward_and_step(
    model, optimizer, X, y, config, distributed=False
):
    """Mistake: the gradients are cleared after backward, so step has none."""
    loss = cross_entropy(model(X), y)
    loss.backward()
    optimizer.zero_grad()
    optimizer.step()
    return loss.item()


def backward_without_step(model, optimizer, X, y, config, distributed=False):
    """Mistake: gradients are computed, the weights never updated."""
    optimizer.zero_grad()
    loss = cross_entropy(model(X), y)
    loss.backward()
    return loss.item()


def all_reduce_on_rank_0_only(model, optimizer, X, y, config, distributed=False):
    """Mistake: the all-reduce sits under ``if rank == 0``: rank 0 waits for ranks
    that never join it."""
    optimizer.zero_grad()
    loss = cross_entropy(model(X), y)
    loss.backward()
    if distributed and dist.get_rank() == 0:
        for parameter in model.parameters():
            dist.all_reduce(parameter.grad)
            parameter.grad /= dist.get_world_size()
    optimizer.step()
    return loss.item()


def raises_on_a_wrong_shape(model, optimizer, X, y, config, distributed=False):
    """Mistake: flattens the images, which the ConvNet refuses."""
    optimizer.zero_grad()
    loss = cross_entropy(model(X.view(len(X), -1)), y)
    loss.backward()
    optimizer.step()
    return loss.item()


def all_reduce_always(model, optimizer, X, y, config, distributed=False):
    """Mistake: all-reduces even in one process, where there is no process group."""
    optimizer.zero_grad()
    loss = cross_entropy(model(X), y)
    loss.backward()
    for parameter in model.parameters():
        dist.all_reduce(parameter.grad)
        parameter.grad /= dist.get_world_size()
    optimizer.step()
    return loss.item()


def clears_gradients_by_hand(model, optimizer, X, y, config, distributed=False):
    """Correct, written another way: gradients set to None by hand, the loss summed
    and divided, and the gradients averaged in one flat buffer."""
    for parameter in model.parameters():
        parameter.grad = None
    loss = cross_entropy(model(X), y, reduction="sum") / len(y)
    loss.backward()
    if distributed:
        grads = [parameter.grad for parameter in model.parameters()]
        flat = torch.cat([grad.reshape(-1) for grad in grads])
        dist.all_reduce(flat)
        flat /= dist.get_world_size()
        offset = 0
        for grad in grads:
            grad.copy_(flat[offset : offset + grad.numel()].view_as(grad))
            offset += grad.numel()
    optimizer.step()
    return loss.item()
