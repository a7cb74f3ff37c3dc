"""Implementations of 09b's exercises that the ranks import: the reference answers
and the mistakes learners make (tests/exercises/test_ddp.py)."""

import contextlib

import torch
import torch.distributed as dist
from torch import nn


def save(path, model, optimizer, epoch):
    """Right: rank 0 saves, every rank waits."""
    if dist.get_rank() == 0:
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
        torch.save({**state, "epoch": epoch}, path)
    dist.barrier()


def load(path, model, optimizer, device):
    """Right: map_location to this rank's device; returns the epoch."""
    checkpoint = torch.load(path, map_location=device)
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    return checkpoint["epoch"]


def save_on_every_rank(path, model, optimizer, epoch):
    """Mistake: every rank writes the file."""
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    torch.save({**state, "epoch": epoch}, path)
    dist.barrier()


def save_without_barrier(path, model, optimizer, epoch):
    """Mistake: rank 0 saves, nobody waits for it."""
    if dist.get_rank() == 0:
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
        torch.save({**state, "epoch": epoch}, path)


def save_with_barrier_on_rank0(path, model, optimizer, epoch):
    """Mistake: the barrier inside `if rank == 0`: the other ranks never reach it."""
    if dist.get_rank() == 0:
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
        torch.save({**state, "epoch": epoch}, path)
        dist.barrier()


def load_without_map_location(path, model, optimizer, device):
    """Mistake: torch.load without map_location."""
    checkpoint = torch.load(path)
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    return checkpoint["epoch"]


def _loss(model, X, y, count):
    return nn.functional.cross_entropy(model(X), y) / count


def step(model, optimizer, micro_batches):
    """Right: no_sync around forward and backward of all but the last."""
    for i, (X, y) in enumerate(micro_batches):
        last = i == len(micro_batches) - 1
        with contextlib.nullcontext() if last else model.no_sync():
            _loss(model, X, y, len(micro_batches)).backward()
    optimizer.step()
    optimizer.zero_grad()


def step_flag_before_forward(model, optimizer, micro_batches):
    """Right too: PyTorch's flag, set before the forward."""
    for i, (X, y) in enumerate(micro_batches):
        model.require_backward_grad_sync = i == len(micro_batches) - 1
        _loss(model, X, y, len(micro_batches)).backward()
    optimizer.step()
    optimizer.zero_grad()


def step_flag_after_forward(model, optimizer, micro_batches):
    """Mistake: the flag set between forward and backward."""
    for i, (X, y) in enumerate(micro_batches):
        loss = _loss(model, X, y, len(micro_batches))
        model.require_backward_grad_sync = i == len(micro_batches) - 1
        loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def step_no_sync_around_backward(model, optimizer, micro_batches):
    """Mistake: the forward outside no_sync, only the backward inside."""
    for i, (X, y) in enumerate(micro_batches):
        loss = _loss(model, X, y, len(micro_batches))
        with (
            contextlib.nullcontext() if i == len(micro_batches) - 1 else model.no_sync()
        ):
            loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def step_sync_every_micro_batch(model, optimizer, micro_batches):
    """Mistake: no no_sync at all: every backward all-reduces."""
    for X, y in micro_batches:
        _loss(model, X, y, len(micro_batches)).backward()
    optimizer.step()
    optimizer.zero_grad()


def step_all_in_no_sync(model, optimizer, micro_batches):
    """Mistake: every micro-batch, the last too, inside no_sync."""
    for X, y in micro_batches:
        with model.no_sync():
            _loss(model, X, y, len(micro_batches)).backward()
    optimizer.step()
    optimizer.zero_grad()


def step_not_divided(model, optimizer, micro_batches):
    """Mistake: the micro-batch losses are not divided by their number."""
    for i, (X, y) in enumerate(micro_batches):
        last = i == len(micro_batches) - 1
        with contextlib.nullcontext() if last else model.no_sync():
            _loss(model, X, y, 1).backward()
    optimizer.step()
    optimizer.zero_grad()


def step_todo(model, optimizer, micro_batches):
    """The exercise as shipped: nothing done."""


def load_without_optimizer(path, model, optimizer, device):
    """Mistake: only the model's state comes back; the optimizer's momentum is lost."""
    checkpoint = torch.load(path, map_location=device)
    model.load_state_dict(checkpoint["model"])
    return checkpoint["epoch"]


def load_other_keys(path, model, optimizer, device):
    """Mistake: looks up keys that save did not write."""
    checkpoint = torch.load(path, map_location=device)
    model.load_state_dict(checkpoint["model_state_dict"])
    optimizer.load_state_dict(checkpoint["optimizer_state_dict"])
    return checkpoint["epoch"]


def save_own_keys(path, model, optimizer, epoch):
    """Right too: other key names, the same in save and load, and a tuple."""
    if dist.get_rank() == 0:
        torch.save(
            {"weights": model.state_dict(), "opt": (optimizer.state_dict(), epoch)},
            path,
        )
    dist.barrier()


def load_own_keys(path, model, optimizer, device):
    """Right too: the keys save_own_keys wrote."""
    checkpoint = torch.load(path, map_location=device)
    model.load_state_dict(checkpoint["weights"])
    optimizer_state, epoch = checkpoint["opt"]
    optimizer.load_state_dict(optimizer_state)
    return epoch


def step_module_no_sync(model, optimizer, micro_batches):
    """Mistake: no_sync asked of the wrapped module, which has none."""
    for i, (X, y) in enumerate(micro_batches):
        last = i == len(micro_batches) - 1
        with contextlib.nullcontext() if last else model.module.no_sync():
            _loss(model, X, y, len(micro_batches)).backward()
    optimizer.step()
    optimizer.zero_grad()


def step_zero_grad_before_step(model, optimizer, micro_batches):
    """Mistake: the gradients cleared between the last backward and the step."""
    for i, (X, y) in enumerate(micro_batches):
        last = i == len(micro_batches) - 1
        with contextlib.nullcontext() if last else model.no_sync():
            _loss(model, X, y, len(micro_batches)).backward()
    optimizer.zero_grad()
    optimizer.step()
