"""One process as the reference, and the distance of a rank's results from it
(15)."""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from multigpu.tensor_parallel.blocks import shard_block_state
from multigpu.tensor_parallel.operators import sequence_chunk


def one_process_block(
    block: nn.Module, x: torch.Tensor, grad_out: torch.Tensor, seed: int = 0
) -> dict[str, Any]:
    """Forward and backward of a copy of ``block`` in this process: its output,
    the input's gradient and the parameters' gradients by name (15)."""
    block = copy.deepcopy(block)
    x = x.clone().requires_grad_(True)
    out = block(x, seed)
    out.backward(grad_out)
    grads = {name: p.grad for name, p in block.named_parameters()}
    return {"out": out.detach(), "x_grad": x.grad, "grads": grads}


def max_difference(
    got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]
) -> float:
    """Largest absolute difference over the tensors of ``expected``, by name; a
    missing name or a different shape is infinitely far (15)."""
    distance = 0.0
    for name, want in expected.items():
        have = got.get(name)
        if have is None or have.shape != want.shape:
            return float("inf")
        distance = max(distance, (have - want).abs().max().item())
    return distance


def one_process_sgd(
    block: nn.Module, X: torch.Tensor, Y: torch.Tensor, steps: int, lr: float
) -> dict[str, torch.Tensor]:
    """A copy of ``block`` after ``steps`` SGD steps on the mean squared error of
    the whole batch: what 2-D parallel training must reach (15)."""
    block = copy.deepcopy(block)
    optimizer = torch.optim.SGD(block.parameters(), lr=lr)
    for _ in range(steps):
        optimizer.zero_grad()
        ((block(X) - Y) ** 2).mean().backward()
        optimizer.step()
    return {name: p.detach() for name, p in block.named_parameters()}


def block_distances(
    result: dict[str, Any],
    reference: dict[str, Any],
    rank: int,
    world_size: int,
    sequence_parallel: bool,
) -> dict[str, float]:
    """How far one rank's :func:`~multigpu.ranks.tensor_parallel.block_rank` result
    is from :func:`one_process_block`'s: output, input gradient (this rank's
    positions under sequence parallelism) and its shards' gradients (15)."""

    def cut(tensor: torch.Tensor) -> torch.Tensor:
        if not sequence_parallel:
            return tensor
        return sequence_chunk(tensor, rank, world_size)

    expected = shard_block_state(reference["grads"], rank, world_size)
    return {
        "output": max_difference({"t": result["out"]}, {"t": cut(reference["out"])}),
        "input grad": max_difference(
            {"t": result["x_grad"]}, {"t": cut(reference["x_grad"])}
        ),
        "parameter grads": max_difference(result["grads"], expected),
    }
