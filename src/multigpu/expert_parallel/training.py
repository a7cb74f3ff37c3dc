"""EP x DP: the experts expert-parallel, everything else data-parallel, on the
same ranks; training steps equal to one process (18).

``world = ep x dp`` ranks, each with its own share of the batch. Rank r is member
r mod ep of an expert-parallel group of ep consecutive ranks, which holds all E
experts between them (E/ep each) and exchanges tokens inside it. A rank's router,
embedding and head are replicas of every other rank's: their gradients are
all-reduced over the whole world, as in DDP. An expert has dp replicas, one per
expert-parallel group (the ranks with the same r mod ep: its *expert-data-parallel*
group, Megatron-LM's name): its gradient already holds every token of its own
group, and is all-reduced over the expert-data-parallel group only. With dp = 1
that group is one rank and the experts' gradients are not all-reduced at all.
All-reduced means summed: each rank's loss is divided by the whole batch's size
(:func:`~multigpu.expert_parallel.layer.moe_loss`), so the sums are one process's
gradients however unevenly the samples are shared.

At the start each rank holds its own random weights: the world's first rank
broadcasts the replicated part, and each expert's first holder its expert.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from multigpu.core.checks import check_positive_int
from multigpu.expert_parallel.dispatch import experts_per_rank
from multigpu.expert_parallel.layer import MoEModel, moe_loss
from multigpu.expert_parallel.parallel import is_expert_parameter

__all__ = [
    "EPLayout",
    "RankGroups",
    "StepHistory",
    "all_reduce_gradients",
    "assemble_start",
    "make_groups",
    "sgd_step",
    "sync_start",
    "train_ep_dp",
    "train_one_process",
]


@dataclass(frozen=True)
class EPLayout:
    """``ranks`` (global ranks) as dp groups of ``ep_size`` consecutive ranks (18)."""

    ranks: tuple[int, ...]
    ep_size: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "ranks", tuple(self.ranks))  # a list is fine too
        check_positive_int("ep_size", self.ep_size)
        if len(self.ranks) % self.ep_size:
            raise ValueError(
                f"{len(self.ranks)} ranks cannot be cut into expert-parallel groups of "
                f"{self.ep_size}. Use an ep_size that divides the number of ranks."
            )

    @property
    def dp_size(self) -> int:
        return len(self.ranks) // self.ep_size

    def ep_groups(self) -> list[tuple[int, ...]]:
        """The expert-parallel groups: consecutive runs of ep_size ranks."""
        ep = self.ep_size
        return [self.ranks[d * ep : (d + 1) * ep] for d in range(self.dp_size)]

    def expert_dp_groups(self) -> list[tuple[int, ...]]:
        """The expert-data-parallel groups: the ranks that hold the same experts."""
        return [self.ranks[i :: self.ep_size] for i in range(self.ep_size)]


@dataclass
class RankGroups:
    """One rank's process groups and their ranks (18): ``world`` (dense data
    parallel), ``ep`` (token exchange) and ``expert_dp`` (expert replicas)."""

    world: dist.ProcessGroup
    ep: dist.ProcessGroup
    expert_dp: dist.ProcessGroup
    ranks: dict[str, tuple[int, ...]] = field(default_factory=dict)


def make_groups(layout: EPLayout, cache: dict | None = None) -> RankGroups | None:
    """Create the layout's groups (every rank of the job must call this, in the same
    order) and return this rank's, or None if it is not in ``layout.ranks``;
    ``cache`` reuses groups of the same ranks (18)."""
    cache = {} if cache is None else cache
    me = dist.get_rank()
    lists = {"world": [layout.ranks], "ep": layout.ep_groups()}
    lists["expert_dp"] = layout.expert_dp_groups()
    mine: dict[str, tuple] = {}
    for kind, groups in lists.items():
        for ranks in groups:
            if ranks not in cache:
                cache[ranks] = dist.new_group(list(ranks))
            if me in ranks:
                mine[kind] = ranks
    if not mine:
        return None
    return RankGroups(*(cache[mine[kind]] for kind in lists), ranks=mine)


def _broadcast_flat(tensors: list[torch.Tensor], source: int, group) -> None:
    """Broadcast ``tensors`` from global rank ``source`` in one message per dtype."""
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for tensor in tensors:
        by_dtype.setdefault(tensor.dtype, []).append(tensor)
    for same in by_dtype.values():
        flat = torch.cat([t.reshape(-1) for t in same])
        dist.broadcast(flat, src=source, group=group)
        for tensor, piece in zip(same, flat.split([t.numel() for t in same])):
            tensor.copy_(piece.view_as(tensor))


def sync_start(model: MoEModel, groups: RankGroups) -> None:
    """Broadcast the replicated weights and buffers from the world's first rank, and
    the local experts from their first holder (the expert-data-parallel group's
    first rank), so that ranks that started from different seeds agree (18)."""
    named = [*model.named_parameters(), *model.named_buffers()]
    experts = [t for name, t in named if is_expert_parameter(name)]
    dense = [t for name, t in named if not is_expert_parameter(name)]
    with torch.no_grad():
        for kind, tensors in (("world", dense), ("expert_dp", experts)):
            if len(groups.ranks[kind]) > 1 and tensors:
                source = groups.ranks[kind][0]
                _broadcast_flat(tensors, source, getattr(groups, kind))


def all_reduce_gradients(model: MoEModel, groups: RankGroups) -> dict[str, str]:
    """Sum each trainable parameter's gradient over its group: the world for the
    replicated ones, the expert-data-parallel group for an expert's (nothing when
    that group is one rank); a missing gradient counts as zeros. Returns the group
    of each parameter: "world", "expert_dp" or "none" (18)."""
    buckets: dict[str, list[tuple[str, torch.Tensor]]] = {"world": [], "expert_dp": []}
    for name, p in model.named_parameters():
        if p.requires_grad:
            kind = "expert_dp" if is_expert_parameter(name) else "world"
            buckets[kind].append((name, p))
    reduced_over = {}
    for kind, named in buckets.items():
        if len(groups.ranks[kind]) == 1 or not named:
            reduced_over.update((name, "none") for name, _ in named)
            continue
        grads = [
            p.grad if p.grad is not None else torch.zeros_like(p) for _, p in named
        ]
        flat = torch.cat([g.reshape(-1) for g in grads])  # one message per group
        dist.all_reduce(flat, group=getattr(groups, kind))
        for (name, p), piece in zip(named, flat.split([g.numel() for g in grads])):
            p.grad = piece.view_as(p).clone()
            reduced_over[name] = kind
    return reduced_over


def sgd_step(model: torch.nn.Module, lr: float) -> None:
    """Plain gradient descent, p -= lr * p.grad, skipping parameters without a
    gradient (18)."""
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p -= lr * p.grad


@dataclass
class StepHistory:
    """A run's record (18): the loss of each step (the whole batch's), the
    load-balancing loss, tokens the router sent to each expert and tokens each
    expert computed (per step, (E,) lists), and the final parameters."""

    losses: list[float] = field(default_factory=list)
    aux_losses: list[float] = field(default_factory=list)
    chosen_per_expert: list[list[int]] = field(default_factory=list)
    kept_per_expert: list[list[int]] = field(default_factory=list)
    parameters: dict[str, torch.Tensor] = field(default_factory=dict)


def train_one_process(
    model: MoEModel,
    X: torch.Tensor,
    y: torch.Tensor,
    steps: int,
    lr: float,
    aux_coef: float,
    group_sizes: list[int] | None = None,
) -> StepHistory:
    """``steps`` of gradient descent on the whole batch in one process: mean
    cross-entropy plus ``aux_coef`` times the load-balancing loss, the capacity
    counted per group of ``group_sizes`` (each rank's share on ranks) (18)."""
    history = StepHistory()
    for _ in range(steps):
        model.zero_grad(set_to_none=True)
        logits, aux, routing = model(X, group_sizes)
        loss = moe_loss(logits, y, aux, len(X), aux_coef)
        loss.backward()
        sgd_step(model, lr)
        history.losses.append(loss.item())
        history.aux_losses.append(aux.item())
        history.chosen_per_expert.append(routing.chosen_per_expert().tolist())
        history.kept_per_expert.append(routing.kept_per_expert().tolist())
    history.parameters = {
        name: p.detach().clone() for name, p in model.named_parameters()
    }
    return history


def train_ep_dp(
    model: MoEModel,
    X: torch.Tensor,
    y: torch.Tensor,
    num_samples: int,
    steps: int,
    lr: float,
    aux_coef: float,
    groups: RankGroups,
) -> tuple[StepHistory, dict[str, str]]:
    """``steps`` of EP x DP gradient descent on this rank's (X, y), ``model``'s
    experts already sharded over ``groups.ep``; the loss of each step and the counts
    per expert are the whole batch's (``num_samples`` samples). Returns the history
    (this rank's parameters) and the group each gradient was summed over (18)."""
    history, reduced_over = StepHistory(), {}
    for _ in range(steps):
        model.zero_grad(set_to_none=True)
        logits, aux, routing = model(X)
        loss = moe_loss(logits, y, aux, num_samples, aux_coef)  # this rank's part
        loss.backward()
        reduced_over = all_reduce_gradients(model, groups)
        sgd_step(model, lr)
        chosen, kept = routing.chosen_per_expert(), routing.kept_per_expert()
        stats = torch.cat([chosen, kept]).double()
        stats = torch.cat([stats, torch.stack([loss, aux]).detach().double()])
        dist.all_reduce(stats, group=groups.world)  # the whole batch's
        num_experts = len(chosen)
        history.chosen_per_expert.append(stats[:num_experts].long().tolist())
        history.kept_per_expert.append(stats[num_experts:-2].long().tolist())
        history.losses.append(stats[-2].item())
        history.aux_losses.append(stats[-1].item())
    history.parameters = {
        name: p.detach().clone() for name, p in model.named_parameters()
    }
    return history, reduced_over


def assemble_start(models: list[MoEModel], ep_size: int) -> MoEModel:
    """The one-process model the ranks agree on after :func:`sync_start`, from each
    rank's starting model (rank order): rank 0's replicated weights, and expert e
    from rank e // (E/ep), its first holder (18)."""
    start = copy.deepcopy(models[0])
    local = experts_per_rank(start.moe.num_experts, ep_size)
    for e, expert in enumerate(start.moe.experts):
        expert.load_state_dict(models[e // local].moe.experts[e].state_dict())
    return start
