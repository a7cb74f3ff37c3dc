"""What learners write for notebook 15's exercises, wrong: conjugate operators and
row-parallel linears (exercise 1), vocabulary-parallel losses (exercise 2),
importable by the ranks that the checkers of
:mod:`multigpu.exercises.tensor_parallel` start."""

import torch
import torch.distributed as dist
from torch.nn import functional as F

from multigpu.collectives import all_gather, ring_all_reduce
from multigpu.tensor_parallel import (
    ReduceFromTensorParallel,
    all_reduce_max,
)

# Exercise 1


class GatherNotReduce(torch.autograd.Function):
    """g's forward all-gathers the partial outputs instead of summing them."""

    @staticmethod
    def forward(ctx, partial):
        gathered = torch.empty(
            (dist.get_world_size() * partial.shape[0], *partial.shape[1:]),
            dtype=partial.dtype,
        )
        all_gather(gathered, partial.contiguous())
        return gathered

    @staticmethod
    def backward(ctx, grad):
        return grad.tensor_split(dist.get_world_size())[dist.get_rank()]


class CopyNoBackwardReduce(torch.autograd.Function):
    """f with an identity backward: the all-reduce in backward is missing."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad


class ReduceBothWays(torch.autograd.Function):
    """g that all-reduces in backward too."""

    @staticmethod
    def forward(ctx, partial):
        out = partial.clone()
        ring_all_reduce(out)
        return out

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        ring_all_reduce(grad)
        return grad


def gather_row_parallel_linear(x_shard, weight_shard, bias):
    """Row-parallel linear on GatherNotReduce."""
    return GatherNotReduce.apply(F.linear(x_shard, weight_shard)) + bias


def bias_first_row_parallel_linear(x_shard, weight_shard, bias):
    """Adds the bias on every rank before the all-reduce."""
    return ReduceFromTensorParallel.apply(F.linear(x_shard, weight_shard, bias))


def both_ways_row_parallel_linear(x_shard, weight_shard, bias):
    """Row-parallel linear on ReduceBothWays."""
    return ReduceBothWays.apply(F.linear(x_shard, weight_shard)) + bias


def unreduced_row_parallel_linear(x_shard, weight_shard, bias):
    """Forgets the all-reduce: returns this rank's partial sum."""
    return F.linear(x_shard, weight_shard) + bias


# Exercise 2: loss_function(local_logits, target, start) -> per-token loss


def _pick(shifted, target, start):
    local = target - start
    mine = (local >= 0) & (local < shifted.shape[-1])
    value = shifted.gather(-1, local.masked_fill(~mine, 0)[:, None])[:, 0]
    return value * mine


def unshifted_loss(logits, target, start):
    """No maximum subtracted: exp overflows for large logits."""
    sum_exp = logits.exp().sum(-1)
    ring_all_reduce(sum_exp)
    picked = _pick(logits, target, start)
    ring_all_reduce(picked)
    return sum_exp.log() - picked


def local_max_loss(logits, target, start):
    """Each rank subtracts its own maximum."""
    shifted = logits - logits.max(-1).values[:, None]
    sum_exp = shifted.exp().sum(-1)
    ring_all_reduce(sum_exp)
    picked = _pick(shifted, target, start)
    ring_all_reduce(picked)
    return sum_exp.log() - picked


def local_sum_loss(logits, target, start):
    """The sum of exponentials is not all-reduced."""
    shifted = logits - all_reduce_max(logits.max(-1).values)[:, None]
    sum_exp = shifted.exp().sum(-1)
    picked = _pick(shifted, target, start)
    ring_all_reduce(picked)
    return sum_exp.log() - picked


def local_target_loss(logits, target, start):
    """The target's logit is not all-reduced."""
    shifted = logits - all_reduce_max(logits.max(-1).values)[:, None]
    sum_exp = shifted.exp().sum(-1)
    ring_all_reduce(sum_exp)
    return sum_exp.log() - _pick(shifted, target, start)
