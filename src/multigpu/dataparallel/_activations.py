"""Activations: the tensors autograd saves for backward, counted per device for
the ledger (03).

Caught with ``torch.autograd.graph.saved_tensors_hooks`` in the thread that runs
the forward. While recording, these hooks replace any the caller set in the same
thread, and they keep autograd's check for tensors modified in place (with a
shorter message).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from itertools import chain
from typing import Any

import torch
from torch import nn

from multigpu.core.devices import Device
from multigpu.dataparallel.placement import tensors_in


def _storage(tensor: torch.Tensor) -> tuple[int, int]:
    """(an id of the memory ``tensor`` views, that memory's size in bytes)."""
    try:
        storage = tensor.untyped_storage()
        return storage.data_ptr(), storage.nbytes()
    except (NotImplementedError, RuntimeError):  # e.g. sparse tensors
        return id(tensor), tensor.numel() * tensor.element_size()


class _SavedTensors:
    """Catches, in the current thread only, every tensor autograd saves for
    backward: ``with saved.catch(): ...``; ``saved.storages``: id -> bytes."""

    def __init__(self) -> None:
        self.storages: dict[int, int] = {}

    def _pack(self, tensor: torch.Tensor) -> tuple[torch.Tensor, int]:
        key, size = _storage(tensor)
        self.storages[key] = size
        return tensor, tensor._version  # kept as is: nothing is copied

    @staticmethod
    def _unpack(packed: tuple[torch.Tensor, int]) -> torch.Tensor:
        tensor, version = packed
        if tensor._version != version:  # the check autograd skips under hooks
            raise RuntimeError(
                "one of the variables needed for gradient computation has been "
                f"modified by an inplace operation: [{tensor.type()} "
                f"{list(tensor.shape)}] is at version {tensor._version}; expected "
                f"version {version} instead."
            )
        return tensor

    @contextmanager
    def catch(self) -> Iterator[None]:
        with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
            yield

    def bytes_besides(self, *counted: Any) -> int:
        """Bytes saved, leaving out the memory of the tensors in ``counted``
        (tensors, containers of tensors, or modules: their weights and buffers)."""
        skip = {_storage(t)[0] for obj in counted for t in _tensors_of(obj)}
        return sum(n for key, n in self.storages.items() if key not in skip)


def _tensors_of(obj: Any) -> Iterator[torch.Tensor]:
    """The tensors in ``obj``; for a module (or a replica, whose weights are plain
    attributes) its parameters, buffers and tensor attributes."""
    if isinstance(obj, nn.Module):
        for module in obj.modules():
            for value in chain(
                module._parameters.values(),
                module._buffers.values(),
                vars(module).values(),
            ):
                if isinstance(value, torch.Tensor):  # skips None (e.g. no bias)
                    yield value
    else:
        yield from tensors_in(obj)


@contextmanager
def _catch_activations(
    recorder: Any, device: Device, *counted: Any
) -> Iterator[list[Any]]:
    """Count what the ``with`` body saves for backward as ``device``'s activations,
    leaving out ``counted`` and whatever the body appends to the yielded list."""
    results: list[Any] = []
    if not torch.is_grad_enabled():
        yield results
        return
    saved = _SavedTensors()
    with saved.catch():
        yield results
    recorder.hold_bytes(device, "activations", saved.bytes_besides(*counted, results))
