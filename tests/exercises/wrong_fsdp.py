"""Wrong answers to notebook 14's exercises that learners really write: the ranks
import them, so they live in a module."""

from multigpu.collectives import all_gather, reduce_scatter


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
