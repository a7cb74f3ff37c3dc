"""What a rank keeps for backward: the bytes of the tensors autograd saves (15).

:func:`saved_activation_bytes` counts, while its block is open, every tensor that
autograd saves for backward through ``torch.autograd.graph.saved_tensors_hooks``
(``torch/autograd/graph.py``), once per storage and without the module's
parameters: the activation memory of one forward, to set against
:func:`multigpu.costmodel.tensor_parallel.tp_activation_values`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn


@contextlib.contextmanager
def saved_activation_bytes(module: nn.Module) -> Iterator[dict[int, int]]:
    """Yield {storage address: bytes} of the non-parameter tensors autograd saves
    inside the block; ``sum(result.values())`` is the activation memory (15)."""
    parameters = {p.untyped_storage().data_ptr() for p in module.parameters()}
    saved: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in parameters:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        yield saved
