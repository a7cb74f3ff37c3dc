"""Expert parallelism by hand: the experts of a :class:`MoELayer` spread over ranks,
the router on every rank (18).

On each rank :class:`ExpertParallelMoE` routes its own tokens (its tokens are one
group for the capacity, as in Megatron-LM, where each rank's router drops tokens),
sends each kept (token, expert) row to the rank that holds the expert
(:func:`~multigpu.expert_parallel.dispatch.dispatch`), runs its own experts on
what it received, sends the results back
(:func:`~multigpu.expert_parallel.dispatch.combine`) and adds them, gated, to its
tokens. Autograd follows the two all-to-alls backwards. For the load-balancing
loss the ranks whose tokens make up the batch (``token_group``) all-reduce their
counts per expert and token numbers, so that the ranks' losses add up to the
whole batch's.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from multigpu.expert_parallel.alltoall import AllToAllRecord
from multigpu.expert_parallel.dispatch import (
    DispatchPlan,
    combine,
    dispatch,
    experts_per_rank,
)
from multigpu.expert_parallel.layer import MoELayer, MoEModel, MoEOutput, kept_choices
from multigpu.expert_parallel.routing import load_balancing_loss, route

__all__ = ["ExpertParallelMoE", "is_expert_parameter", "shard_experts"]


def is_expert_parameter(name: str) -> bool:
    """Whether a parameter of a :class:`MoEModel` belongs to an expert, by its name
    (``moe.experts.<e>.…``): expert weights are expert-parallel, the rest data
    parallel (18)."""
    return ".experts." in f".{name}"


class ExpertParallelMoE(nn.Module):
    """This rank's part of ``layer``: the router and experts r·E/ep … (r+1)·E/ep − 1
    of the expert-parallel ``group`` (modules shared with ``layer``, named as there);
    forward: (n, dim) -> :class:`MoEOutput` (18)."""

    def __init__(
        self,
        layer: MoELayer,
        group: dist.ProcessGroup | None = None,
        token_group: dist.ProcessGroup | None = None,
        log: list[AllToAllRecord] | None = None,
    ) -> None:
        super().__init__()
        local = experts_per_rank(layer.num_experts, dist.get_world_size(group))
        first = dist.get_rank(group) * local
        self.num_experts, self.top_k = layer.num_experts, layer.top_k
        self.capacity_factor = layer.capacity_factor
        self.router = layer.router
        self.experts = nn.ModuleDict(
            {str(e): layer.experts[e] for e in range(first, first + local)}
        )
        self.group, self.token_group, self.log = group, token_group, log
        self.last_plan: DispatchPlan | None = None  # the last forward's, to look at

    def forward(
        self, x: torch.Tensor, group_sizes: list[int] | None = None
    ) -> MoEOutput:
        if group_sizes is not None:
            raise ValueError(
                "On a rank the rank's own tokens are the one group whose capacity the "
                "router counts. Call it without group_sizes."
            )
        routing = route(self.router(x), self.top_k, self.capacity_factor)
        totals = torch.cat([routing.chosen_per_expert(), torch.tensor([len(x)])])
        dist.all_reduce(totals, group=self.token_group)  # the whole batch's counts
        aux = load_balancing_loss(
            routing.probs, totals[:-1], int(totals[-1]), self.top_k
        )
        token, expert_of, gate = kept_choices(routing)
        grouped, per_expert, plan = dispatch(
            x[token], expert_of, self.num_experts, self.group, self.log
        )
        self.last_plan = plan
        chunks = grouped.split(per_expert)  # one per local expert, maybe empty
        outputs = torch.cat(
            [expert(chunk) for expert, chunk in zip(self.experts.values(), chunks)]
        )
        rows = combine(outputs, plan, self.group, self.log)  # (M, dim), x[token]'s
        combined = torch.zeros_like(x).index_add(0, token, rows * gate[:, None])
        return MoEOutput(x + combined, aux, routing)


def shard_experts(
    model: MoEModel,
    group: dist.ProcessGroup | None = None,
    token_group: dist.ProcessGroup | None = None,
    log: list[AllToAllRecord] | None = None,
) -> MoEModel:
    """Keep only this rank's experts of ``model.moe`` (an :class:`ExpertParallelMoE`
    in its place, same parameter names); returns ``model`` (18)."""
    if not isinstance(model.moe, MoELayer):
        raise TypeError(
            f"model.moe is a {type(model.moe).__name__}, not a MoELayer: its experts "
            "are already sharded. Shard a model once."
        )
    model.moe = ExpertParallelMoE(model.moe, group, token_group, log)
    return model
