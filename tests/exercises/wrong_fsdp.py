"""Wrong answers to notebook 14's exercises that learners really write: the ranks
import them, so they live in a module."""

import torch
import torch.distributed as dist

from multigpu.collectives import all_gather, reduce_scatter
from multigpu.fsdp.hooks import UnitHooks


# ----------------------------------------------------------- exercise 1: prefetch
def prefetch_waiting_at_once(wrapper, order, position):
    """Waits on each prefetched handle right away: no overlap."""
    handle = wrapper.issue_gather(order[position])
    for unit in order[position + 1 : position + 1 + wrapper.depth]:
        wrapper.issue_gather(unit).wait()
    handle.wait()


def prefetch_skipping_a_unit(wrapper, order, position):
    """Prefetches the unit after the next one (off by one)."""
    handle = wrapper.issue_gather(order[position])
    for unit in order[position + 2 : position + 2 + wrapper.depth]:
        wrapper.issue_gather(unit)
    handle.wait()


def prefetch_ignoring_depth(wrapper, order, position):
    """Prefetches every later unit: the whole model in memory."""
    handle = wrapper.issue_gather(order[position])
    for unit in order[position + 1 :]:
        wrapper.issue_gather(unit)
    handle.wait()


def prefetch_without_waiting(wrapper, order, position):
    """Never waits for the unit that computes now."""
    for unit in order[position : position + 1 + wrapper.depth]:
        wrapper.issue_gather(unit)


def prefetch_before_own(wrapper, order, position):
    """Issues the prefetches before the unit's own all-gather."""
    for unit in order[position + 1 : position + 1 + wrapper.depth]:
        wrapper.issue_gather(unit)
    wrapper.issue_gather(order[position]).wait()


# ------------------------------------------------- exercise 2: mixed precision
def gather_then_cast(shard, full):
    """All-gathers in float32, casts after: twice the bytes."""
    import torch

    full32 = torch.empty(full.numel(), dtype=shard.dtype)
    sent = all_gather(full32, shard.detach())
    full.copy_(full32)
    return sent


def gather_without_cast(shard, full):
    """Forgets the cast: all_gather refuses a float32 chunk for a bf16 buffer."""
    return all_gather(full, shard.detach())


def gather_casting_the_master(shard, full):
    """Casts the master shard itself: Adam's float32 weights are lost."""
    shard.data = shard.data.to(full.dtype)
    return all_gather(full, shard.detach())


def reduce_in_bf16(full_grad, shard_grad):
    """Reduce-scatters in bfloat16 and casts after: each addition rounds."""
    import torch
    import torch.distributed as dist

    chunk = torch.empty(shard_grad.numel(), dtype=full_grad.dtype)
    sent = reduce_scatter(chunk, full_grad)
    shard_grad.copy_(chunk.float() / dist.get_world_size())
    return sent


def reduce_without_division(full_grad, shard_grad):
    """Forgets to divide by the world size: the sum, not the mean."""
    return reduce_scatter(shard_grad, full_grad.to(shard_grad.dtype))


# ------------------------------------------ exercise 1: the hooks of one unit
# Each class gets one moment wrong, the others as the reference does them.
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
