"""What the ranks run when 14b's checkers try a learner's code: one accumulation
step (:func:`accumulation_check_rank`), a model built on the meta device
(:func:`meta_exercise_rank`) and a wrap that must fit a memory budget
(:func:`budget_check_rank`) (14b)."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from multigpu.fsdp import ResidualBlock
from multigpu.fsdp2 import (
    CollectiveLog,
    MicroBatch,
    cpu_mesh,
    full_parameters,
    layers_to_shard,
    make_optimizer,
    parameter_bytes_held,
    rank_part,
    shard_layers,
)
from multigpu.fsdp2.memory import SavedInsideBlocks, budget_model, step_peak


def accumulation_check_rank(
    rank: int,
    world_size: int,
    step_function: Callable[..., Any],
    model: nn.Module,
    steps: Sequence[Sequence[MicroBatch]],
    lr: float,
) -> dict[str, Any]:
    """Rank function of 14b's checker: shard ``model``, then for each step call the
    learner's ``step_function(model, optimizer, micro_batches)`` with this rank's
    parts and SGD at ``lr``. Returns the full weights, the reduce-scatters
    counted and the optimizer steps taken (14b)."""
    sharded = shard_layers(model)
    optimizer = make_optimizer(sharded, lr, "sgd")
    taken = []
    optimizer.register_step_post_hook(lambda *args: taken.append(1))
    with CollectiveLog(sharded) as log:
        for step in steps:
            mine = [rank_part(micro, rank, world_size) for micro in step]
            step_function(sharded, optimizer, mine)
    return {
        "parameters": full_parameters(sharded),
        "reduce-scatters": log.count("reduce-scatter"),
        "optimizer steps": len(taken),
        "units": len(layers_to_shard(sharded)),
    }


def meta_exercise_rank(
    rank: int,
    world_size: int,
    build_function: Callable[..., nn.Module],
    sizes: Sequence[int],
) -> dict[str, Any]:
    """Rank function of 14b's second checker: the learner's
    ``build_function(build, mesh)`` with a ``build`` that records the device it
    creates parameters on, and ``to_empty`` recording whether the model was
    already sharded. Returns what the checker diagnoses (14b)."""
    from torch.distributed.fsdp import FSDPModule

    from multigpu.zero import make_mlp

    built_on, to_empty_sharded = [], []
    original = nn.Module.to_empty

    def build() -> nn.Module:
        model = make_mlp(sizes, torch.float32)
        built_on.append(next(model.parameters()).device.type)
        return model

    def to_empty(module: nn.Module, *args: Any, **kwargs: Any) -> nn.Module:
        to_empty_sharded.append(isinstance(module, FSDPModule))
        return original(module, *args, **kwargs)

    nn.Module.to_empty = to_empty  # type: ignore[method-assign]
    try:
        with warnings.catch_warnings():  # the lesson explains it (section 6)
            warnings.filterwarnings("ignore", "DTensor random operators")
            model = build_function(build, cpu_mesh())
    finally:
        nn.Module.to_empty = original  # type: ignore[method-assign]
    layers = [m for m in model.modules() if isinstance(m, nn.Linear)]
    spreads = []  # each weight's largest |value| and std, over its init bound
    for layer in layers:
        local = (
            layer.weight.to_local()
            if hasattr(layer.weight, "to_local")
            else layer.weight
        )
        bound = layer.in_features**-0.5  # reset_parameters: uniform(-bound, bound)
        if local.device.type != "meta" and local.numel() > 1:
            spreads.append(
                (local.abs().max().item() / bound, local.std().item() / bound)
            )
    return {
        "built on": built_on,
        "to_empty sharded": to_empty_sharded,
        "root sharded": isinstance(model, FSDPModule),
        "layers sharded": [isinstance(m, FSDPModule) for m in layers],
        "meta parameters": sum(p.device.type == "meta" for p in model.parameters()),
        "spreads": spreads,
        "stored bytes": parameter_bytes_held(model)["sharded"],
        "whole bytes": sum(p.numel() for p in model.parameters()) * 4,
    }


def _units(model: nn.Module) -> list[nn.Module]:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule) and m is not model]


def budget_check_rank(
    rank: int,
    world_size: int,
    wrap_function: Callable[..., nn.Module],
    sizes: Sequence[int],
    batches: Sequence[MicroBatch],
    lr: float,
) -> dict[str, Any]:
    """Rank function of 14b's third checker: the learner's ``wrap_function(model,
    mesh)`` on :func:`~multigpu.fsdp2.memory.budget_model`, then one SGD step per
    global batch of ``batches`` on this rank's part, its peak measured. Returns
    what the checker diagnoses (14b)."""
    from torch.distributed.fsdp import FSDPModule

    mine = [tuple(t.clone() for t in rank_part(b, rank, world_size)) for b in batches]
    initial = budget_model(sizes).state_dict()
    wrapped = wrap_function(budget_model(sizes), cpu_mesh())
    if not isinstance(wrapped, nn.Module):
        return {"returned": "not a module", "type": type(wrapped).__name__}
    units = [
        m for m in wrapped.modules() if isinstance(m, FSDPModule) and m is not wrapped
    ]
    report: dict[str, Any] = {
        "returned": "sharded" if isinstance(wrapped, FSDPModule) else "not sharded",
        "units": len(units),
        "blocks per unit": [
            sum(isinstance(m, ResidualBlock) for m in unit.modules()) for unit in units
        ],
    }
    if report["returned"] == "not sharded":
        return report
    groups = [unit._get_fsdp_state()._fsdp_param_group for unit in units]
    groups = [group for group in groups if group is not None]
    report["units kept after forward"] = sum(
        not group._reshard_after_forward for group in groups
    )
    report["units kept on fewer ranks"] = sum(
        group._use_post_forward_mesh for group in groups
    )
    report["master dtypes"] = sorted(
        {str(p.dtype).replace("torch.", "") for p in wrapped.parameters()}
    )
    report["frozen"] = sum(not p.requires_grad for p in wrapped.parameters())
    before = _plain_names(full_parameters(wrapped))
    report["changed by wrap"] = sorted(before) != sorted(initial) or any(
        not torch.equal(before[name].float(), initial[name]) for name in before
    )
    optimizer = torch.optim.SGD(wrapped.parameters(), lr=lr)
    with SavedInsideBlocks(wrapped) as saved, CollectiveLog(wrapped) as log:
        report["peak"] = step_peak(wrapped, optimizer, mine)
    report["blocks saved whole"] = sum(nbytes > 0 for nbytes in saved.blocks.values())
    report["gather dtypes"] = sorted(
        {c["dtype"] for c in log.calls if c["kind"] == "all-gather"}
    )
    after = _plain_names(full_parameters(wrapped))
    report["parameters"] = {name: p.float() for name, p in after.items()}
    return report


def _plain_names(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The names of the model as built: a checkpoint wrapper's module name out."""
    return {
        name.replace("_checkpoint_wrapped_module.", ""): tensor
        for name, tensor in weights.items()
    }
