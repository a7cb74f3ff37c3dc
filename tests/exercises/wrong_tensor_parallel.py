"""What learners write for notebook 15's exercises, wrong: conjugate operators and
row-parallel linears (exercise 1), vocabulary-parallel losses (exercise 2), plans
for a block on a 2-D mesh (exercise 4, with one right alternative), importable by
the ranks that the checkers of :mod:`multigpu.exercises.tensor_parallel` start."""

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)
from torch.nn import functional as F

from multigpu.collectives import all_gather, ring_all_reduce
from multigpu.tensor_parallel import (
    ReduceFromTensorParallel,
    all_reduce_max,
    vocab_parallel_token_losses,
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


def gathered_logits_loss(logits, target, start):
    """Right numbers, but every rank all-gathers the whole logits first."""
    pieces = [torch.empty_like(logits) for _ in range(dist.get_world_size())]
    dist.all_gather(pieces, logits.contiguous())
    return F.cross_entropy(torch.cat(pieces, dim=-1), target, reduction="none")


def summed_full_logits_loss(logits, target, start):
    """Right numbers, but each rank writes its columns into a vocabulary-wide
    zero tensor and all-reduces it: the whole logits on every rank."""
    world_size = dist.get_world_size()
    full = torch.zeros(len(logits), logits.shape[-1] * world_size, dtype=logits.dtype)
    full[:, start : start + logits.shape[-1]] = logits
    ring_all_reduce(full)
    return F.cross_entropy(full, target, reduction="none")


# Exercise 4: parallelize(block, mesh) on a (dp, tp) mesh

_COLUMN_FIRST = {
    "attn.q": ColwiseParallel,
    "attn.k": ColwiseParallel,
    "attn.v": ColwiseParallel,
    "attn.out": RowwiseParallel,
    "mlp.fc1": ColwiseParallel,
    "mlp.fc2": RowwiseParallel,
}


def _parallelize(block, mesh, styles, tp="tp", dp="dp", heads=True):
    plan = {name: style() for name, style in styles.items()}
    parallelize_module(block, mesh[tp], plan)
    if heads:
        block.attn.heads //= mesh[tp].size()
    if dp:
        fully_shard(block, mesh=mesh[dp])
    return block


def mlp_both_colwise(block, mesh):
    """fc2 cut by columns like fc1."""
    return _parallelize(block, mesh, _COLUMN_FIRST | {"mlp.fc2": ColwiseParallel})


def everything_colwise(block, mesh):
    """Every linear layer cut by columns."""
    return _parallelize(block, mesh, dict.fromkeys(_COLUMN_FIRST, ColwiseParallel))


def rowwise_first(block, mesh):
    """Each pair in the wrong order: the first layers by rows, the second by
    columns."""
    swap = {ColwiseParallel: RowwiseParallel, RowwiseParallel: ColwiseParallel}
    return _parallelize(block, mesh, {n: swap[s] for n, s in _COLUMN_FIRST.items()})


def mlp_rowwise_first(block, mesh):
    """Attention right, the MLP's pair in the wrong order."""
    mlp = {"mlp.fc1": RowwiseParallel, "mlp.fc2": ColwiseParallel}
    return _parallelize(block, mesh, _COLUMN_FIRST | mlp)


def without_attention_output(block, mesh):
    """The attention's output projection is missing from the plan."""
    styles = {n: s for n, s in _COLUMN_FIRST.items() if n != "attn.out"}
    return _parallelize(block, mesh, styles)


def tp_over_dp(block, mesh):
    """Tensor parallel over "dp" and FSDP over "tp": the dimensions swapped."""
    return _parallelize(block, mesh, _COLUMN_FIRST, tp="dp", dp="tp")


def whole_mesh(block, mesh):
    """parallelize_module on the 2-D mesh itself."""
    plan = {name: style() for name, style in _COLUMN_FIRST.items()}
    parallelize_module(block, mesh, plan)
    block.attn.heads //= 2
    fully_shard(block, mesh=mesh["dp"])
    return block


def heads_unchanged(block, mesh):
    """The right plan, but the attention still counts every head."""
    return _parallelize(block, mesh, _COLUMN_FIRST, heads=False)


def without_fully_shard(block, mesh):
    """Tensor parallel only: nothing over dp."""
    return _parallelize(block, mesh, _COLUMN_FIRST, dp=None)


def nothing(block, mesh):
    """The exercise's empty cell: the block unchanged."""
    return block


def per_submodule(block, mesh):
    """Right, written differently: one parallelize_module per submodule, fully_shard
    on attention and MLP first, then on the block."""
    tp_mesh = mesh["tp"]
    attention = {"q": ColwiseParallel(), "k": ColwiseParallel()}
    attention |= {"v": ColwiseParallel(), "out": RowwiseParallel()}
    parallelize_module(block.attn, tp_mesh, attention)
    parallelize_module(block.mlp.fc1, tp_mesh, ColwiseParallel())
    parallelize_module(block.mlp.fc2, tp_mesh, RowwiseParallel())
    block.attn.heads = block.attn.heads // tp_mesh.size()
    for part in (block.attn, block.mlp, block):
        fully_shard(part, mesh=mesh["dp"])
    return block


def raising_loss(logits, target, start):
    """A typo: the local columns' width taken from the wrong dimension."""
    return logits.new_zeros(len(target)) + logits.shape[2]


def rank_zero_sum_loss(logits, target, start):
    """Only rank 0 all-reduces the sum of exponentials: the other rank never joins
    that collective, and the ranks wait for each other."""
    shifted = logits - all_reduce_max(logits.max(-1).values)[:, None]
    sum_exp = shifted.exp().sum(-1)
    if dist.get_rank() == 0:
        ring_all_reduce(sum_exp)
    picked = _pick(shifted, target, start)
    ring_all_reduce(picked)
    return sum_exp.log() - picked


def heads_typo(block, mesh):
    """The right plan, then a typo in the head count: a method, not its value."""
    plan = {name: style() for name, style in _COLUMN_FIRST.items()}
    parallelize_module(block, mesh["tp"], plan)
    block.attn.heads //= mesh["tp"].size
    fully_shard(block, mesh=mesh["dp"])
    return block


def rank_zero_extra_all_reduce_loss(logits, target, start):
    """Right, but rank 0 alone all-reduces the result once more at the end: the
    other rank has returned and never joins it."""
    loss = vocab_parallel_token_losses(logits, target, start)
    if dist.get_rank() == 0:
        dist.all_reduce(loss.clone())
    return loss
