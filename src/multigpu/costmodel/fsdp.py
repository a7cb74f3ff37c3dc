"""FSDP's memory and traffic per rank, with mixed precision and prefetch (14).

What a rank of FSDP (by hand, :mod:`multigpu.fsdp`, or FSDP2) keeps for good, per
parameter of the model, over N ranks, with master weights of m bytes (4: float32):
its chunk of the master weights m/N, of their gradient m/N and of Adam's two moments
2m/N, 16/N bytes in all (:func:`fsdp_bytes_per_parameter`). Mixed precision does
not change these: the bfloat16 copies live only while a unit is in use. In flight
are the gathered units (p bytes per number, 2 for bf16): with prefetch depth d at
most d + 1 consecutive units of the forward order at once, all units if they stay
gathered from forward to backward (:func:`fsdp_peak_gathered_bytes`); a unit's
gradient in the compute dtype and its copy in the reduce dtype while it is reduced.

Traffic per step: each unit all-gathered twice (forward and backward; once when it
stays gathered) at p bytes a number and reduce-scattered once at r bytes (4 for an
fp32 reduction), each pass (n-1)/n of the unit (:func:`fsdp_bytes_sent_theory`);
counted chunk by chunk as :mod:`multigpu.collectives` sends it:
:func:`fsdp_bytes_sent_per_rank`. :func:`fsdp_memory_ledger` adds it all up, with
the saved activations, for one rank.
"""

from __future__ import annotations

from collections.abc import Sequence

from multigpu.core.checks import check_positive_int
from multigpu.costmodel.communication import (
    all_gather_bytes_per_rank,
    reduce_scatter_bytes_per_rank,
)

FSDP_LEDGER_CATEGORIES = (
    "parameters",
    "gradients",
    "optimizer",
    "gathered",
    "activations",
)


def fsdp_bytes_per_parameter(world_size: int, master_bytes: int = 4) -> dict:
    """Bytes per parameter each rank keeps between steps: master weights, their
    gradient and Adam's two moments, each cut into ``world_size`` chunks (14)."""
    check_positive_int("world_size", world_size)
    return {
        "parameters": master_bytes / world_size,
        "gradients": master_bytes / world_size,
        "optimizer": 2 * master_bytes / world_size,
    }


def fsdp_peak_gathered_bytes(
    unit_numels: Sequence[int],
    depth: int,
    param_bytes: int,
    reshard_after_forward: bool = True,
) -> int:
    """Most bytes of gathered parameters alive at once: the largest sum of
    ``depth + 1`` consecutive units (``unit_numels`` in forward order, numbers in
    each) times ``param_bytes``; every unit if they stay gathered after forward
    (14)."""
    if not reshard_after_forward:
        return sum(unit_numels) * param_bytes
    window = depth + 1
    sums = [sum(unit_numels[i : i + window]) for i in range(len(unit_numels))]
    return max(sums, default=0) * param_bytes


def fsdp_prefetch_overhead_bytes(
    unit_numels: Sequence[int], depth: int, param_bytes: int
) -> int:
    """What prefetching ``depth`` units ahead adds to the peak of depth 0 (14)."""
    return fsdp_peak_gathered_bytes(
        unit_numels, depth, param_bytes
    ) - fsdp_peak_gathered_bytes(unit_numels, 0, param_bytes)


def fsdp_bytes_sent_theory(
    num_parameters: float,
    world_size: int,
    param_bytes: int = 4,
    reduce_bytes: int = 4,
    reshard_after_forward: bool = True,
) -> float:
    """Bytes each rank sends per step: (2 or 1)·(n-1)/n·P·p for the all-gathers
    and (n-1)/n·P·r for the reduce-scatter (14)."""
    check_positive_int("world_size", world_size)
    gathers = 2 if reshard_after_forward else 1
    share = (world_size - 1) / world_size * num_parameters
    return share * (gathers * param_bytes + reduce_bytes)


def fsdp_bytes_sent_per_rank(
    unit_numels: Sequence[int],
    world_size: int,
    rank: int,
    param_bytes: int = 4,
    reduce_bytes: int = 4,
    reshard_after_forward: bool = True,
) -> int:
    """Exact bytes ``rank`` sends in one step of :class:`multigpu.fsdp.FSDPByHand`,
    chunk by chunk, for the units that ran (``unit_numels``) (14)."""
    gathers = 2 if reshard_after_forward else 1
    return sum(
        gathers * all_gather_bytes_per_rank(numel, param_bytes, world_size, rank)
        + reduce_scatter_bytes_per_rank(numel, reduce_bytes, world_size, rank)
        for numel in unit_numels
    )


def fsdp_memory_ledger(
    num_parameters: float,
    world_size: int,
    unit_numels: Sequence[int],
    depth: int = 0,
    param_bytes: int = 4,
    master_bytes: int = 4,
    activation_bytes: float = 0,
) -> dict[str, float]:
    """One rank's bytes by category (:data:`FSDP_LEDGER_CATEGORIES`): the sharded
    state for ``num_parameters`` (equal chunks), the peak of gathered units and
    the saved activations (14)."""
    per_parameter = fsdp_bytes_per_parameter(world_size, master_bytes)
    ledger = {name: value * num_parameters for name, value in per_parameter.items()}
    ledger["gathered"] = fsdp_peak_gathered_bytes(unit_numels, depth, param_bytes)
    ledger["activations"] = activation_bytes
    return ledger


def _segments(blocks: int, every: int, segment: int) -> list[tuple[int, bool]]:
    """(blocks in it, checkpointed?) per segment, as CheckpointedStack cuts them."""
    return [
        (min(segment, blocks - first), every > 0 and j % every == 0)
        for j, first in enumerate(range(0, blocks, segment))
    ]


def checkpointed_activation_bytes(
    blocks: int,
    block_bytes: float,
    input_bytes: float,
    every: int = 0,
    segment: int = 1,
) -> float:
    """Bytes a stack of ``blocks`` keeps from forward to backward: each block saves
    ``block_bytes`` (its input included), a checkpointed segment only its input
    ``input_bytes``; segments of ``segment`` blocks, one in every ``every`` is
    checkpointed (0: none), as :class:`multigpu.fsdp.CheckpointedStack` cuts them
    (14)."""
    return sum(
        input_bytes if checkpointed else size * block_bytes
        for size, checkpointed in _segments(blocks, every, segment)
    )


def checkpointed_peak_bytes(
    blocks: int,
    block_bytes: float,
    input_bytes: float,
    every: int = 0,
    segment: int = 1,
) -> float:
    """The peak of saved bytes over forward AND backward: when backward reaches a
    segment, the segments before it still keep what forward left them, and this
    one holds all its blocks' saved tensors (recomputed if it was checkpointed);
    the largest such sum (at least what forward keeps) (14)."""
    peak = before = 0.0
    for size, checkpointed in _segments(blocks, every, segment):
        peak = max(peak, before + size * block_bytes)
        before += input_bytes if checkpointed else size * block_bytes
    return max(peak, before)


def recompute_bytes(segment: int, block_bytes: float) -> float:
    """What recomputing one checkpointed segment adds in backward, for a while:
    its blocks' saved tensors (14)."""
    return segment * block_bytes


def sqrt_rule_segment(blocks: int) -> int:
    """The √n rule (Chen et al., 2016): segments of about √n blocks minimize
    n/k inputs kept plus k blocks recomputed at once, when a block saves about as
    much as its input; the nearest whole number (14). A block that saves more than
    its input wants shorter segments: :func:`best_checkpoint_segment`."""
    check_positive_int("blocks", blocks)
    return max(1, round(blocks**0.5))


def best_checkpoint_segment(blocks: int, block_bytes: float, input_bytes: float) -> int:
    """The segment length k (every segment checkpointed) with the lowest
    :func:`checkpointed_peak_bytes`, about √(n · input / block); the shortest of
    equals (14)."""
    check_positive_int("blocks", blocks)
    return min(
        range(1, blocks + 1),
        key=lambda k: checkpointed_peak_bytes(blocks, block_bytes, input_bytes, 1, k),
    )
