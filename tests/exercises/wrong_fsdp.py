"""Wrong answers to notebook 14's exercises that learners really write: the ranks
import them, so they live in a module."""

import torch
import torch.distributed as dist

from multigpu.collectives import all_gather, reduce_scatter
from multigpu.fsdp.hooks import UnitHooks


# ------------------------------------------------------- the hooks of one unit
class HooksNeverFreedAfterForward(UnitHooks):
    """Keeps the unit gathered from forward to backward: no memory saved."""

    def post_forward(self, unit):
        pass


class HooksNotGatheredForBackward(UnitHooks):
    """Frees after forward and never gathers again: backward has no weights."""

    def pre_backward(self, unit):
        pass


class HooksAllocatedNotFilled(UnitHooks):
    """Brings the memory back before backward but forgets the all-gather."""

    def pre_backward(self, unit):
        unit.allocate()


class HooksFreedBeforeBackwardUsedIt(UnitHooks):
    """Gathers again before backward, then frees at once, 'to save memory'."""

    def pre_backward(self, unit):
        super().pre_backward(unit)
        unit.free()


class HooksNeverFreedAfterBackward(UnitHooks):
    """Reduce-scatters but keeps the gathered unit after backward."""

    def post_backward(self, unit, grad):
        chunk = torch.empty_like(unit.shard)
        reduce_scatter(chunk, grad)
        unit.shard.grad = chunk / dist.get_world_size()


class HooksAllReduce(UnitHooks):
    """All-reduces the whole gradient, then keeps its own chunk: right numbers,
    twice the traffic."""

    def post_backward(self, unit, grad):
        unit.free()
        dist.all_reduce(grad)
        chunk = grad.tensor_split(dist.get_world_size())[dist.get_rank()]
        unit.shard.grad = chunk / dist.get_world_size()


class HooksSumNotMean(UnitHooks):
    """Forgets to divide by the world size."""

    def post_backward(self, unit, grad):
        unit.free()
        chunk = torch.empty_like(unit.shard)
        reduce_scatter(chunk, grad)
        unit.shard.grad = chunk


class HooksOwnGradientOnly(UnitHooks):
    """Keeps its own chunk of its own gradient: nothing is reduced."""

    def post_backward(self, unit, grad):
        unit.free()
        rank, world_size = dist.get_rank(), dist.get_world_size()
        unit.shard.grad = grad.tensor_split(world_size)[rank].clone()


class HooksWholeGradient(UnitHooks):
    """Reduces the whole gradient and keeps all of it on every rank."""

    def post_backward(self, unit, grad):
        unit.free()
        total = grad.clone()
        dist.all_reduce(total)
        unit.shard.grad = total / dist.get_world_size()


class HooksGatherIntoFreedMemory(UnitHooks):
    """All-gathers into the buffer without bringing its memory back."""

    def pre_forward(self, unit):
        all_gather(unit.buffer, unit.shard.detach())


class HooksGatherOnRankZero(UnitHooks):
    """Only rank 0 gathers: the other ranks never join the collective."""

    def pre_forward(self, unit):
        unit.allocate()
        if dist.get_rank() == 0:
            all_gather(unit.buffer, unit.shard.detach())


class HooksReducingIntoTheShard(UnitHooks):
    """Reduce-scatters the gradient into the shard itself: the weights become the
    gradient."""

    def post_backward(self, unit, grad):
        unit.free()
        reduce_scatter(unit.shard.data, grad)
        unit.shard.grad = unit.shard.detach() / dist.get_world_size()


# --------------------------- correct alternatives that the checker must accept
class HooksDividingFirst(UnitHooks):
    """Divides before the reduce-scatter, and gathers through one helper."""

    def gather(self, unit):
        unit.allocate()
        all_gather(unit.buffer, unit.shard.detach())

    def pre_forward(self, unit):
        self.gather(unit)

    def pre_backward(self, unit):
        self.gather(unit)

    def post_backward(self, unit, grad):
        chunk = torch.empty_like(unit.shard)
        reduce_scatter(chunk, grad / dist.get_world_size())
        unit.free()  # after the reduce-scatter: fine too
        if unit.shard.grad is None:
            unit.shard.grad = chunk
        else:
            unit.shard.grad += chunk


class HooksOnlyRankZeroReduces(UnitHooks):
    """Only rank 0 reduce-scatters: the other ranks wait for it forever."""

    def post_backward(self, unit, grad):
        unit.free()
        chunk = torch.zeros_like(unit.shard)
        if dist.get_rank() == 0:
            reduce_scatter(chunk, grad)
        dist.barrier()
        unit.shard.grad = chunk / dist.get_world_size()
