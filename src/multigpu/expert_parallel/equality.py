"""Expert parallel against one process: what each rank computes for a case, and how
far the ranks' results, put together, are from one process's (18).

A :class:`LayerCase` is one forward and backward of a mixture-of-experts layer: its
tokens cut over the case's ranks, a fixed weight for each output value (so the
loss is a weighted sum of the outputs, every output value gets its own gradient)
plus the load-balancing loss. :func:`layer_on_rank` runs it on one rank of the
case; :func:`layer_differences` compares the ranks' results with
:func:`layer_in_one_process`. An :class:`EPDPCase` is a few training steps of EP x
DP (:func:`ep_dp_on_rank`, :func:`ep_dp_differences`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from multigpu.expert_parallel.layer import MoELayer, MoEModel, steered_tokens
from multigpu.expert_parallel.parallel import ExpertParallelMoE, shard_experts
from multigpu.expert_parallel.training import (
    EPLayout,
    StepHistory,
    assemble_start,
    make_groups,
    sync_start,
    train_ep_dp,
    train_one_process,
)

__all__ = [
    "EPDPCase",
    "LayerCase",
    "ep_dp_differences",
    "ep_dp_on_rank",
    "layer_differences",
    "layer_in_one_process",
    "layer_on_rank",
    "merge_parameters",
    "random_layer_case",
    "steered_layer_case",
]


@dataclass
class LayerCase:
    """One forward and backward of ``layer`` on X (N, dim), ``sizes[i]`` tokens on
    the i-th rank of ``ranks``; loss: (output * weights).sum() + aux_coef * aux (18)."""

    name: str
    layer: MoELayer
    X: torch.Tensor
    sizes: list[int]
    weights: torch.Tensor
    aux_coef: float
    ranks: tuple[int, ...]

    def piece(self, tensor: torch.Tensor, position: int) -> torch.Tensor:
        return tensor.split(self.sizes)[position]


def random_layer_case(
    name: str,
    sizes: Sequence[int],
    top_k: int = 1,
    capacity_factor: float | None = None,
    dtype: torch.dtype = torch.float64,
    seed: int = 0,
    ranks: Sequence[int] | None = None,
    dim: int = 4,
    num_experts: int = 4,
) -> LayerCase:
    """A :class:`LayerCase` of random tokens (``sizes[i]`` on the i-th rank, ranks
    0, 1, ... unless ``ranks`` says), a layer of hidden width 6 from ``seed`` (18)."""
    torch.manual_seed(seed)
    layer = MoELayer(dim, 6, num_experts, top_k, capacity_factor).to(dtype)
    generator = torch.Generator().manual_seed(seed + 100)
    X = torch.randn(sum(sizes), dim, generator=generator, dtype=torch.float64)
    weights = torch.randn(sum(sizes), dim, generator=generator, dtype=torch.float64)
    ranks = tuple(range(len(sizes))) if ranks is None else tuple(ranks)
    return LayerCase(
        name, layer, X.to(dtype), list(sizes), weights.to(dtype), 0.1, ranks
    )


def steered_layer_case(
    name: str,
    routes: Sequence[Sequence[int]],
    top_k: int = 1,
    capacity_factor: float | None = None,
    dtype: torch.dtype = torch.float64,
    seed: int = 1,
    ranks: Sequence[int] | None = None,
    dim: int = 4,
    num_experts: int = 4,
) -> LayerCase:
    """A :class:`LayerCase` whose i-th rank's tokens go first to the experts
    ``routes[i]`` (:func:`~multigpu.expert_parallel.layer.steered_tokens`) (18)."""
    case = random_layer_case(
        name, [len(r) for r in routes], top_k, capacity_factor, dtype, seed, ranks,
        dim, num_experts,
    )  # fmt: skip
    generator = torch.Generator().manual_seed(seed + 200)
    case.X = steered_tokens(case.layer, [e for r in routes for e in r], generator)
    return case


def layer_in_one_process(case: LayerCase) -> dict:
    """The layer on all N tokens in one process, each rank's tokens a capacity group:
    output, input gradient, parameter gradients, load-balancing loss, routing (18)."""
    layer = case.layer
    layer.zero_grad(set_to_none=True)
    x = case.X.clone().requires_grad_(True)
    out = layer(x, case.sizes)
    ((out.output * case.weights).sum() + case.aux_coef * out.aux_loss).backward()
    return {
        "output": out.output.detach(),
        "input_grad": x.grad,
        "grads": {n: p.grad for n, p in layer.named_parameters()},
        "aux": out.aux_loss.item(),
        "routing": out.routing,
    }


def layer_on_rank(case: LayerCase, cache: dict) -> dict | None:
    """This rank's part of ``case`` (None if not one of its ranks): its outputs, the
    gradients of its tokens and parameters, its share of the load-balancing loss,
    the all-to-alls it saw and what its experts computed; a refusal as
    {"refused": message} (18)."""
    groups = make_groups(EPLayout(case.ranks, len(case.ranks)), cache)
    if groups is None:
        return None
    position = case.ranks.index(dist.get_rank())
    log: list = []
    try:
        moe = ExpertParallelMoE(case.layer, groups.ep, groups.world, log)
    except ValueError as error:
        return {"refused": str(error)}
    x = case.piece(case.X, position).clone().requires_grad_(True)
    out = moe(x)
    weights = case.piece(case.weights, position)
    ((out.output * weights).sum() + case.aux_coef * out.aux_loss).backward()
    experts = {int(e) for e in moe.experts}
    kept = out.routing.kept_per_expert()  # what this rank's tokens kept, per expert
    return {
        "output": out.output.detach(),
        "input_grad": x.grad,
        "grads": {n: p.grad for n, p in moe.named_parameters()},
        "aux": out.aux_loss.item(),
        "log": log,
        "sent_per_expert": kept.tolist(),
        "experts": sorted(experts),
        "input_split_sizes": moe.last_plan.input_split_sizes,
        "output_split_sizes": moe.last_plan.output_split_sizes,
    }


def layer_differences(case: LayerCase, results: list[dict]) -> dict[str, float]:
    """The largest |difference| from one process, per quantity: outputs and input
    gradients (the ranks' rows in order), the router's gradient (summed over the
    ranks), each expert's gradient (from its rank), the loss (summed) (18)."""
    reference = layer_in_one_process(case)
    ranks = [r for r in results if r is not None]

    def worst(a: torch.Tensor, b: torch.Tensor) -> float:
        return (a - b).abs().max().item() if a.numel() else 0.0

    router = sum(r["grads"]["router.weight"] for r in ranks)
    expert_gaps = [
        worst(g, reference["grads"][name])
        for r in ranks
        for name, g in r["grads"].items()
        if name.startswith("experts.")
    ]
    names = {name for r in ranks for name in r["grads"] if name.startswith("experts.")}
    if names != {n for n in reference["grads"] if n.startswith("experts.")}:
        return {"expert_grads": float("inf")}  # an expert no rank holds: not equal
    return {
        "output": worst(torch.cat([r["output"] for r in ranks]), reference["output"]),
        "input_grad": worst(
            torch.cat([r["input_grad"] for r in ranks]), reference["input_grad"]
        ),
        "router_grad": worst(router, reference["grads"]["router.weight"]),
        "expert_grads": max(expert_gaps),
        "aux": abs(sum(r["aux"] for r in ranks) - reference["aux"]),
    }


@dataclass
class EPDPCase:
    """Training steps of EP x DP (18): ``models[i]``, the i-th rank's own start
    (different seeds); X, y cut ``sizes``; ``ranks`` as groups of ``ep_size``."""

    name: str
    models: list[MoEModel]
    X: torch.Tensor
    y: torch.Tensor
    sizes: list[int]
    ranks: tuple[int, ...]
    ep_size: int
    steps: int = 3
    lr: float = 0.5
    aux_coef: float = 0.01


def ep_dp_on_rank(case: EPDPCase, cache: dict) -> dict | None:
    """This rank's training for ``case`` (None if not one of its ranks): its
    parameters at the end, its history and the group of each gradient (18)."""
    groups = make_groups(EPLayout(case.ranks, case.ep_size), cache)
    if groups is None:
        return None
    position = case.ranks.index(dist.get_rank())
    model = case.models[position]
    shard_experts(model, groups.ep, groups.world)  # keep this rank's experts
    sync_start(model, groups)  # then agree with the ranks that hold the same
    X, y = case.X.split(case.sizes)[position], case.y.split(case.sizes)[position]
    history, reduced_over = train_ep_dp(
        model, X, y, len(case.X), case.steps, case.lr, case.aux_coef, groups
    )
    return {"history": history, "reduced_over": reduced_over}


def merge_parameters(results: list[dict | None]) -> dict[str, torch.Tensor]:
    """The whole model's parameters from the ranks' results: each name from the
    first rank that holds it; the other holders must agree bit for bit (18)."""
    merged: dict[str, torch.Tensor] = {}
    for result in results:
        if result is None:
            continue
        for name, tensor in result["history"].parameters.items():
            if name in merged and not torch.equal(merged[name], tensor):
                raise ValueError(
                    f"The replicas of {name} differ between ranks after training. Sum "
                    "each gradient over the ranks that hold the parameter."
                )
            merged.setdefault(name, tensor)
    return merged


def ep_dp_differences(
    case: EPDPCase, results: list[dict | None]
) -> tuple[float, StepHistory]:
    """The largest |parameter difference| after training between the ranks and one
    process started from the weights the ranks agreed on, and one process's
    history (18)."""
    start = assemble_start(case.models, case.ep_size)
    reference = train_one_process(
        start, case.X, case.y, case.steps, case.lr, case.aux_coef, case.sizes
    )
    merged = merge_parameters(results)
    if merged.keys() != reference.parameters.keys():
        return float("inf"), reference  # a parameter no rank holds: not equal
    gap = max(
        (merged[n] - p).abs().max().item() for n, p in reference.parameters.items()
    )
    return gap, reference
