"""The router of a mixture-of-experts layer: top-k softmax gates, each expert's
capacity and the tokens it drops, and the auxiliary load-balancing loss (18).

A token's router logits go through a softmax over the E experts; the token goes to
its ``top_k`` most probable experts, each weighted by its probability (the *gate*;
with top_k = 1 this is the Switch Transformer's router). An expert takes at most
``capacity = ceil(tokens * top_k / E * capacity_factor)`` tokens of a group (the
tokens of one rank); the others are *dropped* for that expert and reach the next
layer only through the residual path. Priority goes to first choices, then second
choices, each in token order (GShard's order). The load-balancing loss is the
Switch Transformer's (Fedus, Zoph and Shazeer, "Switch Transformers: Scaling to
Trillion Parameter Models with Simple and Efficient Sparsity", JMLR 2022,
arXiv:2101.03961, equation 4): E * sum_e f_e * P_e, with f_e the fraction of the
router's choices that go to expert e and P_e the mean probability it gives e.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.nn import functional as F

from multigpu.core.checks import check_number, check_positive_int

__all__ = [
    "Routing",
    "expert_capacity",
    "load_balancing_loss",
    "route",
]


@dataclass
class Routing:
    """Where a batch of N tokens goes (18): ``probs`` (N, E), the router's softmax;
    ``experts`` (N, k), each token's experts, best first; ``gates`` (N, k), their
    probabilities; ``kept`` (N, k), whether the expert had room for the token;
    ``capacity``: the capacity of each group (None: no limit)."""

    probs: torch.Tensor
    experts: torch.Tensor
    gates: torch.Tensor
    kept: torch.Tensor
    capacity: list[int] | None

    @property
    def num_experts(self) -> int:
        return self.probs.shape[1]

    def chosen_per_expert(self) -> torch.Tensor:
        """(E,) int64: how many tokens the router sent to each expert, dropped ones
        included (what the load-balancing loss counts)."""
        return torch.bincount(self.experts.reshape(-1), minlength=self.num_experts)

    def kept_per_expert(self) -> torch.Tensor:
        """(E,) int64: how many tokens each expert computes (within its capacity)."""
        return torch.bincount(self.experts[self.kept], minlength=self.num_experts)

    def dropped(self) -> int:
        """How many (token, expert) choices found their expert full."""
        return int((~self.kept).sum())


def expert_capacity(
    num_tokens: int, num_experts: int, top_k: int, capacity_factor: float
) -> int:
    """ceil(num_tokens * top_k / num_experts * capacity_factor): the most tokens one
    expert takes from a group of ``num_tokens`` (Megatron-LM's ``get_capacity``)
    (18)."""
    check_number("capacity_factor", capacity_factor, "Pass e.g. capacity_factor=1.25.")
    return math.ceil(num_tokens * top_k / num_experts * capacity_factor)


def _kept_in_group(experts: torch.Tensor, num_experts: int, capacity: int):
    """(n, k) bool: each choice within its expert's first ``capacity`` places, first
    choices before second ones, each in token order."""
    order = experts.T.reshape(-1)  # (k * n,) first choices, then second choices
    one_hot = F.one_hot(order, num_experts)  # (k * n, E)
    place = ((one_hot.cumsum(0) - 1) * one_hot).sum(1)  # place in its expert's queue
    return (place < capacity).reshape(experts.shape[1], -1).T


def route(
    logits: torch.Tensor,
    top_k: int = 1,
    capacity_factor: float | None = None,
    group_sizes: list[int] | None = None,
) -> Routing:
    """Route N tokens from their router ``logits`` (N, E): softmax, top-k, and, with
    a ``capacity_factor``, the capacity of each group of consecutive tokens
    (``group_sizes``, default one group: all N) (18)."""
    num_tokens, num_experts = logits.shape
    check_positive_int("top_k", top_k)
    if top_k > num_experts:
        raise ValueError(
            f"top_k={top_k} is more experts than the layer has ({num_experts}). Use "
            f"top_k of at most {num_experts}."
        )
    sizes = [num_tokens] if group_sizes is None else list(group_sizes)
    if sum(sizes) != num_tokens or any(size < 0 for size in sizes):
        raise ValueError(
            f"group_sizes {sizes} do not cut {num_tokens} tokens into groups. Give "
            f"sizes of 0 or more that add up to {num_tokens}."
        )
    probs = torch.softmax(logits, dim=-1)  # (N, E)
    gates, experts = probs.topk(top_k, dim=-1)  # (N, k) each, best first
    if capacity_factor is None:
        kept = torch.ones_like(experts, dtype=torch.bool)
        return Routing(probs, experts, gates, kept, None)
    capacity = [
        expert_capacity(size, num_experts, top_k, capacity_factor) for size in sizes
    ]
    pieces = [
        _kept_in_group(group, num_experts, room)
        for group, room in zip(experts.split(sizes), capacity, strict=True)
    ]
    kept = torch.cat(pieces) if pieces else torch.ones_like(experts, dtype=torch.bool)
    return Routing(probs, experts, gates, kept, capacity)


def load_balancing_loss(
    probs: torch.Tensor,
    chosen_per_expert: torch.Tensor,
    num_tokens: int,
    top_k: int = 1,
) -> torch.Tensor:
    """The Switch Transformer's auxiliary loss E * sum_e f_e * P_e, f_e =
    chosen_per_expert[e] / (num_tokens * top_k) and P_e = probs[:, e].sum() /
    num_tokens (18). With the counts and ``num_tokens`` of the whole batch and
    ``probs`` of one rank's tokens, the ranks' results add up to the whole batch's
    (Megatron-LM's ``switch_load_balancing_loss_func`` does the same)."""
    num_experts = probs.shape[1]
    if num_tokens == 0:
        return probs.sum() * 0.0  # no token, no loss (and a graph for backward)
    fraction = chosen_per_expert.to(probs.dtype) / (num_tokens * top_k)  # f_e
    mean_probability = probs.sum(0) / num_tokens  # P_e: this rank's share of it
    return num_experts * (fraction * mean_probability).sum()
