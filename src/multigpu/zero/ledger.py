"""What a rank holds: the ledger, measured on the tensors themselves (13).

Every rank measures what it holds after a step (:func:`measure_ledger`: the memory
behind each tensor, a buffer counted once). The formulas it must equal are
``costmodel.zero_memory_ledger``; the figure of the ledgers is
:func:`multigpu.plots.plot_zero_ledgers`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import nn

from multigpu.zero.zero3 import Meter


def storage_bytes(tensors: Iterable[torch.Tensor | None]) -> int:
    """Bytes of memory behind ``tensors``, each buffer counted once: a view keeps
    its whole buffer alive, so it counts as the whole buffer (13)."""
    buffers = {}
    for tensor in tensors:
        if tensor is not None:
            storage = tensor.untyped_storage()
            buffers[storage.data_ptr()] = storage.nbytes()
    return sum(buffers.values())


def measure_ledger(
    parameters: Sequence[torch.Tensor],
    optimizer: torch.optim.Optimizer,
    meter: Meter | None = None,
) -> dict[str, int]:
    """Bytes this rank holds, by category: ``parameters`` (and their ``.grad``),
    Adam's moments, and the peak of gathered full layers (13).

    Adam's step counter (one number per tensor) is left out, as the paper leaves
    it out. For DTensors (FSDP2) the local shard is measured.
    """

    def local(tensor):
        return tensor.to_local() if hasattr(tensor, "to_local") else tensor

    moments = [
        local(value)
        for state in optimizer.state.values()
        for name, value in state.items()
        if name in ("exp_avg", "exp_avg_sq")
    ]
    return {
        "parameters": storage_bytes(local(p) for p in parameters),
        "gradients": storage_bytes(
            local(p.grad) for p in parameters if p.grad is not None
        ),
        "optimizer": storage_bytes(moments),
        "gathered": meter.peak_gathered_bytes if meter else 0,
    }


def layer_numels(model: nn.Module) -> list[int]:
    """Parameters per layer that has any, in order: how ZeRO-3 groups them (13)."""
    return [
        sum(p.numel() for p in layer.parameters(recurse=False))
        for layer in model.modules()
        if next(layer.parameters(recurse=False), None) is not None
    ]
