"""What learners write for notebook 13's exercises, right and wrong: ZeRO-2 steps
(exercise 1) and FSDP2 rank functions (exercise 3), importable by the ranks that
the checkers of :mod:`multigpu.exercises.zero` start."""

from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.nn import functional as F

from multigpu.collectives import all_gather, reduce_scatter
from multigpu.core.sharding import run_batches
from multigpu.zero import pop_flat_gradients

# Exercise 1: ZeRO-2 steps that are wrong.


def undivided_zero2_step(model, flat, shard, optimizer, X, y):
    """Forgot to divide the reduce-scattered sum by the world size."""
    loss = F.cross_entropy(model(X), y)
    loss.backward()
    gradients = pop_flat_gradients(model)
    shard.grad = torch.empty_like(shard)
    sent = reduce_scatter(shard.grad, gradients)
    optimizer.step()
    sent += all_gather(flat, shard.detach())
    return loss.item(), sent


def gather_first_zero2_step(model, flat, shard, optimizer, X, y):
    """All-gathered the chunks before the optimizer step updated them."""
    loss = F.cross_entropy(model(X), y)
    loss.backward()
    gradients = pop_flat_gradients(model)
    shard.grad = torch.empty_like(shard)
    sent = reduce_scatter(shard.grad, gradients)
    shard.grad /= dist.get_world_size()
    sent += all_gather(flat, shard.detach())
    optimizer.step()
    return loss.item(), sent


def ungathered_zero2_step(model, flat, shard, optimizer, X, y):
    """Forgot the all-gather: each rank keeps only its own updated chunk."""
    loss = F.cross_entropy(model(X), y)
    loss.backward()
    gradients = pop_flat_gradients(model)
    shard.grad = torch.empty_like(shard)
    sent = reduce_scatter(shard.grad, gradients)
    shard.grad /= dist.get_world_size()
    optimizer.step()
    return loss.item(), sent


def full_gradient_zero2_step(model, flat, shard, optimizer, X, y):
    """Gave the optimizer the full flat gradient instead of the shard's chunk."""
    loss = F.cross_entropy(model(X), y)
    loss.backward()
    gradients = pop_flat_gradients(model)
    sent = reduce_scatter(torch.empty_like(shard), gradients)
    shard.grad = gradients / dist.get_world_size()  # (P,), not the chunk's (P/N,)
    optimizer.step()
    sent += all_gather(flat, shard.detach())
    return loss.item(), sent


# Exercise 3: FSDP2 rank functions, the solution and mistakes.


def _train(model, X, y, config, world_size, rank):
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
    for indices in run_batches(len(X), config, world_size, rank)[0]:
        optimizer.zero_grad()
        F.cross_entropy(model(X[indices]), y[indices]).backward()
        optimizer.step()


def _shard(network, mesh, per_layer=True):
    if per_layer:
        for layer in network:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
    fully_shard(network, mesh=mesh)


def fsdp2_checkpoint_rank(rank, world_size, model, fresh, X, y, config, checkpoint_dir):
    """The solution of the solutions notebook."""
    mesh = init_device_mesh("cpu", (world_size,))
    for network in (model, fresh):
        _shard(network, mesh)
    _train(model, X, y, config, world_size, rank)
    dcp.save({"model": model.state_dict()}, checkpoint_id=checkpoint_dir)
    state = {"model": fresh.state_dict()}
    dcp.load(state, checkpoint_id=checkpoint_dir)
    fresh.load_state_dict(state["model"])


def meshless_fsdp2_rank(rank, world_size, model, fresh, X, y, config, checkpoint_dir):
    """Forgot the explicit mesh: fully_shard(layer) alone."""
    for network in (model, fresh):
        for layer in network:
            if isinstance(layer, nn.Linear):
                fully_shard(layer)
        fully_shard(network)
    _train(model, X, y, config, world_size, rank)
    dcp.save({"model": model.state_dict()}, checkpoint_id=checkpoint_dir)
    dcp.load({"model": fresh.state_dict()}, checkpoint_id=checkpoint_dir)


def root_only_fsdp2_rank(rank, world_size, model, fresh, X, y, config, checkpoint_dir):
    """Sharded only the whole model, not each layer."""
    mesh = init_device_mesh("cpu", (world_size,))
    for network in (model, fresh):
        _shard(network, mesh, per_layer=False)
    _train(model, X, y, config, world_size, rank)
    dcp.save({"model": model.state_dict()}, checkpoint_id=checkpoint_dir)
    dcp.load({"model": fresh.state_dict()}, checkpoint_id=checkpoint_dir)


def torch_save_fsdp2_rank(rank, world_size, model, fresh, X, y, config, checkpoint_dir):
    """Saved on rank 0 only, with torch.save, as for an ordinary model."""
    mesh = init_device_mesh("cpu", (world_size,))
    for network in (model, fresh):
        _shard(network, mesh)
    _train(model, X, y, config, world_size, rank)
    if rank == 0:
        torch.save(model.state_dict(), Path(checkpoint_dir) / "model.pt")
    dcp.load({"model": fresh.state_dict()}, checkpoint_id=checkpoint_dir)


def other_layout_fsdp2_rank(
    rank, world_size, model, fresh, X, y, config, checkpoint_dir
):
    """Saved {"model": state_dict} but loaded the bare state_dict."""
    mesh = init_device_mesh("cpu", (world_size,))
    for network in (model, fresh):
        _shard(network, mesh)
    _train(model, X, y, config, world_size, rank)
    dcp.save({"model": model.state_dict()}, checkpoint_id=checkpoint_dir)
    dcp.load(fresh.state_dict(), checkpoint_id=checkpoint_dir)


def unloaded_fsdp2_rank(rank, world_size, model, fresh, X, y, config, checkpoint_dir):
    """Saved, but never loaded the checkpoint into fresh."""
    mesh = init_device_mesh("cpu", (world_size,))
    for network in (model, fresh):
        _shard(network, mesh)
    _train(model, X, y, config, world_size, rank)
    dcp.save({"model": model.state_dict()}, checkpoint_id=checkpoint_dir)
