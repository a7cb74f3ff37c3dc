"""What learners write for notebook 13's exercises, right and wrong: ZeRO-2 steps
with PyTorch's collectives (exercise 1) and FSDP2 rank functions (exercise 3),
importable by the ranks that the checkers of :mod:`multigpu.exercises.zero` start."""

import math
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed import all_reduce  # bound when the ranks import this module
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.nn import functional as F

from multigpu.collectives import all_gather, reduce_scatter
from multigpu.core.batches import run_batches
from multigpu.zero import pop_flat_gradients

# Exercise 1: ZeRO-2 steps with PyTorch's collectives, which need equal chunks.


def _padded(tensor, length):
    return F.pad(tensor, (0, length - tensor.numel()))


def _scatter(model, flat, shard, X, y, collective="reduce_scatter"):
    """Forward, backward, and this rank's chunk of the summed gradient, (c,)."""
    world_size = dist.get_world_size()
    loss = F.cross_entropy(model(X), y)
    loss.backward()
    gradients = pop_flat_gradients(model)  # (P,)
    chunk = math.ceil(flat.numel() / world_size)
    padded = _padded(gradients, chunk * world_size)  # (n·c,)
    if collective == "all_reduce":
        dist.all_reduce(padded)
        rank = dist.get_rank()
        return loss, padded[rank * chunk : (rank + 1) * chunk]  # a view of (n·c,)
    mine = torch.empty(chunk, dtype=flat.dtype)
    dist.reduce_scatter_single(mine, padded)
    return loss, mine


def _gather(flat, shard):
    world_size = dist.get_world_size()
    chunk = math.ceil(flat.numel() / world_size)
    gathered = torch.empty(chunk * world_size, dtype=flat.dtype)
    dist.all_gather_single(gathered, _padded(shard.detach(), chunk))
    flat.copy_(gathered[: flat.numel()])


def padded_zero2_step(model, flat, shard, optimizer, X, y):
    """The solution: pad to n equal chunks, reduce-scatter, mean, step, gather."""
    loss, mine = _scatter(model, flat, shard, X, y)
    shard.grad = mine[: shard.numel()] / dist.get_world_size()
    optimizer.step()
    _gather(flat, shard)
    return loss.item()


def hand_collectives_zero2_step(model, flat, shard, optimizer, X, y):
    """Correct too: the padded buffer through 07's hand-written ring collectives."""
    world_size = dist.get_world_size()
    loss = F.cross_entropy(model(X), y)
    loss.backward()
    chunk = math.ceil(flat.numel() / world_size)
    padded = _padded(pop_flat_gradients(model), chunk * world_size)
    mine = torch.empty(chunk, dtype=flat.dtype)
    reduce_scatter(mine, padded)  # equal chunks: tensor_split's cut is chunk's
    shard.grad = mine[: shard.numel()].clone() / world_size
    optimizer.step()
    gathered = torch.empty(chunk * world_size, dtype=flat.dtype)
    all_gather(gathered, _padded(shard.detach(), chunk))
    flat.copy_(gathered[: flat.numel()])
    return loss, 0  # a (loss, bytes) pair, as the lesson's steps return


def untouched_zero2_step(model, flat, shard, optimizer, X, y):
    """The exercise's TODOs left as they are."""
    loss = F.cross_entropy(model(X), y)
    loss.backward()
    pop_flat_gradients(model)
    return loss.item()


def unpadded_zero2_step(model, flat, shard, optimizer, X, y):
    """Gave PyTorch's reduce-scatter the unpadded gradient."""
    loss = F.cross_entropy(model(X), y)
    loss.backward()
    shard.grad = torch.empty_like(shard)
    dist.reduce_scatter_single(shard.grad, pop_flat_gradients(model))
    shard.grad /= dist.get_world_size()
    optimizer.step()
    dist.all_gather_single(flat, shard.detach())
    return loss.item()


def undivided_zero2_step(model, flat, shard, optimizer, X, y):
    """Forgot to divide the reduce-scattered sum by the world size."""
    loss, mine = _scatter(model, flat, shard, X, y)
    shard.grad = mine[: shard.numel()].clone()
    optimizer.step()
    _gather(flat, shard)
    return loss.item()


def gather_first_zero2_step(model, flat, shard, optimizer, X, y):
    """All-gathered the chunks before the optimizer step updated them."""
    loss, mine = _scatter(model, flat, shard, X, y)
    shard.grad = mine[: shard.numel()] / dist.get_world_size()
    _gather(flat, shard)
    optimizer.step()
    return loss.item()


def ungathered_zero2_step(model, flat, shard, optimizer, X, y):
    """Forgot the all-gather: each rank keeps only its own updated chunk."""
    loss, mine = _scatter(model, flat, shard, X, y)
    shard.grad = mine[: shard.numel()] / dist.get_world_size()
    optimizer.step()
    return loss.item()


def gathered_into_a_copy_zero2_step(model, flat, shard, optimizer, X, y):
    """All-gathered into a new tensor and never copied it into flat."""
    loss, mine = _scatter(model, flat, shard, X, y)
    shard.grad = mine[: shard.numel()] / dist.get_world_size()
    optimizer.step()
    chunk = mine.numel()
    gathered = torch.empty(chunk * dist.get_world_size(), dtype=flat.dtype)
    dist.all_gather_single(gathered, _padded(shard.detach(), chunk))
    flat = gathered[: flat.numel()]  # rebinds the name; the model never sees it
    return loss.item()


def front_padded_zero2_step(model, flat, shard, optimizer, X, y):
    """Put the padding in front: every chunk after it is shifted."""
    world_size = dist.get_world_size()
    loss = F.cross_entropy(model(X), y)
    loss.backward()
    chunk = math.ceil(flat.numel() / world_size)
    gradients = pop_flat_gradients(model)
    padded = F.pad(gradients, (chunk * world_size - flat.numel(), 0))
    mine = torch.empty(chunk, dtype=flat.dtype)
    dist.reduce_scatter_single(mine, padded)
    shard.grad = mine[: shard.numel()] / world_size
    optimizer.step()
    _gather(flat, shard)
    return loss.item()


def all_reduce_zero2_step(model, flat, shard, optimizer, X, y):
    """ZeRO-1's all-reduce, then the chunk (copied, so the memory looks right)."""
    loss, mine = _scatter(model, flat, shard, X, y, collective="all_reduce")
    shard.grad = mine[: shard.numel()].clone() / dist.get_world_size()
    optimizer.step()
    _gather(flat, shard)
    return loss.item()


def view_of_all_reduced_zero2_step(model, flat, shard, optimizer, X, y):
    """ZeRO-1 with a collective the checker cannot count (imported by name before
    the ranks start): the gradient kept is a view of the whole summed buffer."""
    world_size, rank = dist.get_world_size(), dist.get_rank()
    loss = F.cross_entropy(model(X), y)
    loss.backward()
    chunk = math.ceil(flat.numel() / world_size)
    padded = _padded(pop_flat_gradients(model), chunk * world_size)
    all_reduce(padded)
    padded /= world_size
    shard.grad = padded[rank * chunk : rank * chunk + shard.numel()]  # a view
    optimizer.step()
    _gather(flat, shard)
    return loss.item()


def one_rank_gathers_zero2_step(model, flat, shard, optimizer, X, y):
    """Only rank 0 all-gathers: the others never join the collective."""
    loss, mine = _scatter(model, flat, shard, X, y)
    shard.grad = mine[: shard.numel()] / dist.get_world_size()
    optimizer.step()
    if dist.get_rank() == 0:
        _gather(flat, shard)
    return loss.item()


def full_gradient_zero2_step(model, flat, shard, optimizer, X, y):
    """Gave the optimizer the whole padded chunk, padding included."""
    loss, mine = _scatter(model, flat, shard, X, y)
    shard.grad = mine / dist.get_world_size()  # (c,), the last rank's is longer
    optimizer.step()
    _gather(flat, shard)
    return loss.item()


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


def unsharded_fsdp2_rank(rank, world_size, model, fresh, X, y, config, checkpoint_dir):
    """The exercise's TODOs left as they are: nothing sharded, saved, or loaded."""
    _train(model, X, y, config, world_size, rank)


def layers_only_fsdp2_rank(
    rank, world_size, model, fresh, X, y, config, checkpoint_dir
):
    """Sharded each Linear but not the whole network."""
    mesh = init_device_mesh("cpu", (world_size,))
    for network in (model, fresh):
        for layer in network:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
    _train(model, X, y, config, world_size, rank)
    dcp.save({"model": model.state_dict()}, checkpoint_id=checkpoint_dir)
    state = {"model": fresh.state_dict()}
    dcp.load(state, checkpoint_id=checkpoint_dir)
    fresh.load_state_dict(state["model"])
