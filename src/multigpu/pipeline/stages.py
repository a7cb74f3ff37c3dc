"""A model cut into consecutive stages, and a batch cut into micro-batches (16).

Pipeline parallelism gives each rank a run of consecutive layers (a *stage*) and
streams the batch through them in *micro-batches*. The cut is what one process
would compute, so the model must be an ``nn.Sequential``; a model that cannot be
cut exactly is refused by name: a weight tied across two stages (its gradient
would need an all-reduce between them, as Megatron-LM does for a tied embedding)
and BatchNorm in training mode (each micro-batch would be normalised on its own).
"""

from __future__ import annotations

import torch
from torch import nn

from multigpu.core.checks import check_positive_int

__all__ = [
    "split_microbatches",
    "split_sequential",
    "stage_sizes",
]


def stage_sizes(num_modules: int, num_stages: int) -> list[int]:
    """How many modules each stage gets, as ``tensor_split`` cuts: the first
    ``num_modules % num_stages`` stages get one more, e.g. 10 over 4: [3, 3, 2, 2]."""
    check_positive_int("num_stages", num_stages)
    if num_modules < num_stages:
        raise ValueError(
            f"A model of {num_modules} modules cannot be cut into {num_stages} "
            "stages: every stage needs at least one module. Use fewer stages or a "
            "deeper model."
        )
    base, extra = divmod(num_modules, num_stages)
    return [base + (1 if stage < extra else 0) for stage in range(num_stages)]


_BATCHNORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)


def _check_no_batchnorm(model: nn.Sequential) -> None:
    for name, module in model.named_modules():
        if isinstance(module, _BATCHNORMS) and module.training:
            raise ValueError(
                f"Module {name!r} is a BatchNorm in training mode: in a pipeline each "
                "micro-batch would be normalised on its own, which is not one process "
                "on the whole batch. Use LayerNorm, or call .eval() on it."
            )


def _check_no_tied_weights(stages: list[nn.Sequential]) -> None:
    owner: dict[int, tuple[int, str]] = {}  # id(tensor) -> (stage, name in model)
    offset = 0
    for index, stage in enumerate(stages):
        named = [*stage.named_parameters(), *stage.named_buffers()]
        for local, tensor in named:
            position, _, rest = local.partition(".")
            name = f"{offset + int(position)}.{rest}"
            first = owner.setdefault(id(tensor), (index, name))
            if first[0] != index:
                raise ValueError(
                    f"A weight is tied between stage {first[0]} ({first[1]}) and "
                    f"stage {index} ({name}): each stage would train its own copy. "
                    "Cut the model so that tied modules fall in one stage, or untie "
                    "them."
                )
        offset += len(stage)


def split_sequential(model: nn.Module, num_stages: int) -> list[nn.Sequential]:
    """Cut ``model`` (an ``nn.Sequential``) into ``num_stages`` consecutive
    ``nn.Sequential`` stages that share its modules (no copy), sizes as
    :func:`stage_sizes`; refuse a model a pipeline cannot train like one process."""
    if not isinstance(model, nn.Sequential):
        raise TypeError(
            f"split_sequential needs an nn.Sequential, got {type(model).__name__}. "
            "Write the model as nn.Sequential(...) of its layers in order."
        )
    _check_no_batchnorm(model)
    modules = list(model)
    stages, start = [], 0
    for size in stage_sizes(len(modules), num_stages):
        stages.append(nn.Sequential(*modules[start : start + size]))
        start += size
    _check_no_tied_weights(stages)
    return stages


def split_microbatches(
    X: torch.Tensor, y: torch.Tensor, num_microbatches: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Cut the batch into ``num_microbatches`` pieces along dimension 0 as
    ``tensor_split`` does (41 into 4: 11, 10, 10, 10); refuse an empty piece."""
    check_positive_int("num_microbatches", num_microbatches)
    if num_microbatches > len(X):
        raise ValueError(
            f"num_microbatches={num_microbatches} is more micro-batches than the "
            f"batch has samples ({len(X)}): some would be empty. Use at most "
            f"{len(X)} micro-batches."
        )
    return list(zip(X.tensor_split(num_microbatches), y.tensor_split(num_microbatches)))
