"""Dispatch and combine: a rank's tokens to the ranks that hold their experts, and
the experts' outputs back (18).

The E experts are cut into equal runs, E / ep per rank: rank r holds experts
r·E/ep to (r+1)·E/ep − 1. A rank sorts its rows (one per token and chosen expert)
by expert, so that the rows for each rank are consecutive; how many go where is
not known in advance and differs from rank to rank, so the ranks first exchange
their counts per expert (a small all-to-all). Then each rank knows both lists of
split sizes: what it sends to each rank (its own counts) and what it receives from
each (the others' counts for its experts). The received rows come source by
source; :func:`dispatch` regroups them expert by expert for the expert MLPs, and
:func:`combine` undoes every step in reverse: regroup, all-to-all with the sizes
swapped, sort.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from multigpu.core.checks import check_positive_int
from multigpu.expert_parallel.alltoall import AllToAllRecord, all_to_all, exchange_rows

__all__ = [
    "DispatchPlan",
    "combine",
    "dispatch",
    "exchange_counts",
    "experts_per_rank",
    "inverse_permutation",
]


def experts_per_rank(num_experts: int, ep_size: int) -> int:
    """E / ep, the experts each rank holds; refuse an E that ep does not divide (18)."""
    check_positive_int("num_experts", num_experts)
    check_positive_int("ep_size", ep_size)
    if num_experts % ep_size:
        raise ValueError(
            f"{num_experts} experts cannot be split evenly over {ep_size} "
            "expert-parallel ranks: each rank must hold the same number of experts. "
            f"Use a number of experts divisible by {ep_size}, or an expert-parallel "
            f"size that divides {num_experts}."
        )
    return num_experts // ep_size


def inverse_permutation(order: torch.Tensor) -> torch.Tensor:
    """The permutation that undoes ``order``: x[order][inverse] equals x (18)."""
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(len(order), device=order.device)
    return inverse


@dataclass
class DispatchPlan:
    """What :func:`combine` needs to undo :func:`dispatch` (18): ``order`` (the rows
    sorted by expert), ``input_split_sizes`` (rows sent to each rank),
    ``output_split_sizes`` (rows received from each), ``received_counts`` (ep,
    E/ep): rows from each rank for each local expert, ``regroup``: the received
    row of each row of the expert-by-expert layout."""

    order: torch.Tensor
    input_split_sizes: list[int]
    output_split_sizes: list[int]
    received_counts: torch.Tensor
    regroup: torch.Tensor


def exchange_counts(
    counts_per_expert: torch.Tensor,
    group: dist.ProcessGroup | None = None,
    log: list[AllToAllRecord] | None = None,
) -> torch.Tensor:
    """Each rank's (E,) rows per expert in, (ep, E/ep) out: row s holds what rank
    s sends to each of this rank's experts (an all-to-all of E/ep counts per pair)
    (18)."""
    ep_size = dist.get_world_size(group)
    local = experts_per_rank(len(counts_per_expert), ep_size)
    received = exchange_rows(
        counts_per_expert, [local] * ep_size, [local] * ep_size, group, log, "counts"
    )
    return received.reshape(ep_size, local)


def dispatch(
    rows: torch.Tensor,
    expert_of_row: torch.Tensor,
    num_experts: int,
    group: dist.ProcessGroup | None = None,
    log: list[AllToAllRecord] | None = None,
) -> tuple[torch.Tensor, list[int], DispatchPlan]:
    """Send each row (M, dim) to the rank holding its expert (``expert_of_row``,
    (M,)); return the rows this rank's experts must compute, grouped expert by
    expert, how many each expert gets, and the plan that :func:`combine` undoes (18)."""
    ep_size = dist.get_world_size(group)
    local = experts_per_rank(num_experts, ep_size)
    order = torch.argsort(expert_of_row, stable=True)  # rows for rank 0 first, ...
    counts = torch.bincount(expert_of_row, minlength=num_experts)  # (E,)
    received_counts = exchange_counts(counts, group, log)  # (ep, E/ep)
    input_split_sizes = counts.reshape(ep_size, local).sum(1).tolist()
    output_split_sizes = received_counts.sum(1).tolist()
    received = all_to_all(
        rows[order], output_split_sizes, input_split_sizes, group, log, "dispatch"
    )
    # received: source by source, each source's rows expert by expert
    starts = received_counts.reshape(-1).cumsum(0) - received_counts.reshape(-1)
    starts = starts.reshape(ep_size, local)
    regroup = [
        torch.arange(int(starts[s, e]), int(starts[s, e] + received_counts[s, e]))
        for e in range(local)
        for s in range(ep_size)
    ]
    regroup = torch.cat(regroup).to(order.device)
    plan = DispatchPlan(
        order, input_split_sizes, output_split_sizes, received_counts, regroup
    )
    return received[regroup], received_counts.sum(0).tolist(), plan


def combine(
    expert_outputs: torch.Tensor,
    plan: DispatchPlan,
    group: dist.ProcessGroup | None = None,
    log: list[AllToAllRecord] | None = None,
) -> torch.Tensor:
    """The experts' outputs (in :func:`dispatch`'s expert-by-expert layout) back to
    the ranks that sent the rows, in the order of the rows given to dispatch (18)."""
    by_source = expert_outputs[inverse_permutation(plan.regroup)]
    returned = all_to_all(
        by_source,
        plan.input_split_sizes,  # what came from each rank goes back to it
        plan.output_split_sizes,
        group,
        log,
        "combine",
    )
    return returned[inverse_permutation(plan.order)]  # undo the sort by expert
