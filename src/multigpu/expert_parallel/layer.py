"""A mixture-of-experts layer in one process, and a small model around it (18).

:class:`MoELayer` holds a router (a linear map to one logit per expert) and E
experts (small MLPs). Each token goes to its top-k experts within their capacity
(:func:`~multigpu.expert_parallel.routing.route`); the layer's output is the token
plus the gated sum of its experts' outputs, so that a token every expert dropped
comes out unchanged: the residual path (the Switch Transformer's "passed directly
to the next layer through the residual connection"). :class:`MoEModel` puts an
optional embedding before the layer and any head after it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from multigpu.core.checks import check_positive_int
from multigpu.expert_parallel.routing import Routing, load_balancing_loss, route

__all__ = [
    "Expert",
    "MoELayer",
    "MoEModel",
    "MoEOutput",
    "kept_choices",
    "make_moe_classifier",
    "moe_loss",
    "steered_tokens",
]


class Expert(nn.Module):
    """One expert, a two-layer MLP: (n, dim) -> (n, dim) (18)."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.tanh(self.fc1(x)))


@dataclass
class MoEOutput:
    """What a mixture-of-experts layer returns (18): ``output`` (N, dim), the
    ``aux_loss`` (the load-balancing loss, or on a rank its share of the whole
    batch's) and the ``routing`` of its tokens."""

    output: torch.Tensor
    aux_loss: torch.Tensor
    routing: Routing


def kept_choices(routing: Routing) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The (token, expert) choices within capacity, in token order: the token of
    each, its expert and its gate, three (M,) tensors (18)."""
    token, slot = routing.kept.nonzero(as_tuple=True)
    return token, routing.experts[token, slot], routing.gates[token, slot]


class MoELayer(nn.Module):
    """A mixture-of-experts layer in one process: (N, dim) -> :class:`MoEOutput`,
    ``num_experts`` experts of width ``hidden``, each token to its ``top_k`` best,
    at most ``capacity_factor`` times an even share per expert (None: no limit) (18)."""

    def __init__(
        self,
        dim: int,
        hidden: int,
        num_experts: int,
        top_k: int = 1,
        capacity_factor: float | None = None,
    ) -> None:
        super().__init__()
        self.num_experts = check_positive_int("num_experts", num_experts)
        self.top_k = check_positive_int("top_k", top_k)
        self.capacity_factor = capacity_factor
        self.router = nn.Linear(dim, num_experts, bias=False)
        self.experts = nn.ModuleList(Expert(dim, hidden) for _ in range(num_experts))

    def forward(
        self, x: torch.Tensor, group_sizes: list[int] | None = None
    ) -> MoEOutput:
        routing = route(self.router(x), self.top_k, self.capacity_factor, group_sizes)
        token, expert_of, gate = kept_choices(routing)
        combined = torch.zeros_like(x)
        for index, expert in enumerate(self.experts):
            mine = expert_of == index  # may be empty: the expert then gets zeros
            out = expert(x[token[mine]]) * gate[mine, None]
            combined = combined.index_add(0, token[mine], out)
        chosen = routing.chosen_per_expert()
        aux = load_balancing_loss(routing.probs, chosen, len(x), self.top_k)
        return MoEOutput(x + combined, aux, routing)


class MoEModel(nn.Module):
    """x -> ``embed`` (optional) -> ``moe`` -> ``head``; forward returns (logits,
    aux_loss, routing). The layer may be a :class:`MoELayer` or its expert-parallel
    version on a rank (18)."""

    def __init__(
        self, moe: nn.Module, head: nn.Module, embed: nn.Module | None = None
    ) -> None:
        super().__init__()
        self.embed = embed
        self.moe = moe
        self.head = head

    def forward(self, x: torch.Tensor, group_sizes: list[int] | None = None):
        h = x if self.embed is None else self.embed(x)
        out = self.moe(h, group_sizes)
        return self.head(out.output), out.aux_loss, out.routing


def make_moe_classifier(
    dtype: torch.dtype = torch.float64,
    seed: int = 0,
    in_features: int = 6,
    dim: int = 8,
    hidden: int = 8,
    num_experts: int = 4,
    classes: int = 3,
    top_k: int = 1,
    capacity_factor: float | None = None,
    frozen: tuple[str, ...] = (),
) -> MoEModel:
    """(N, in_features) -> logits (N, classes) through Linear + tanh, a
    :class:`MoELayer` and a linear head, built from ``seed``; the parameters named
    in ``frozen`` get requires_grad=False (18)."""
    torch.manual_seed(seed)
    embed = nn.Sequential(nn.Linear(in_features, dim), nn.Tanh())
    moe = MoELayer(dim, hidden, num_experts, top_k, capacity_factor)
    model = MoEModel(moe, nn.Linear(dim, classes), embed).to(dtype)
    parameters = dict(model.named_parameters())
    for name in frozen:
        if name not in parameters:
            raise KeyError(
                f"The model has no parameter {name!r} to freeze. Name one of "
                f"{sorted(parameters)}."
            )
        parameters[name].requires_grad_(False)
    return model


def moe_loss(
    logits: torch.Tensor,
    y: torch.Tensor,
    aux_loss: torch.Tensor,
    num_samples: int,
    aux_coef: float,
) -> torch.Tensor:
    """Summed cross-entropy over ``num_samples`` (the whole batch's size) plus
    ``aux_coef`` times the load-balancing loss: on ranks, the parts add up to one
    process's mean loss (18)."""
    return F.cross_entropy(logits, y, reduction="sum") / num_samples + (
        aux_coef * aux_loss
    )


def steered_tokens(
    layer: MoELayer,
    experts: Sequence[int],
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Tokens (n, dim) whose first choice in ``layer`` is ``experts[i]``: sets the
    router's weight to 4·[I | 0] (needs dim >= E) and makes token i 2·e_i plus
    noise below 0.1, so the routing of a demonstration is known in advance (18)."""
    dim = layer.router.in_features
    if dim < layer.num_experts:
        raise ValueError(
            f"Steering needs at least one input feature per expert: dim={dim} < "
            f"{layer.num_experts} experts. Use dim >= num_experts."
        )
    dtype = layer.router.weight.dtype
    with torch.no_grad():
        layer.router.weight.copy_(4 * torch.eye(layer.num_experts, dim, dtype=dtype))
    chosen = torch.as_tensor(list(experts), dtype=torch.int64)
    noise = torch.rand(len(chosen), dim, generator=generator, dtype=dtype) * 0.1
    return noise + 2 * F.one_hot(chosen, dim).to(dtype)
