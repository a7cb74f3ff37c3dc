"""Steps 1 and 4 of DataParallel: ``scatter`` the batch, ``gather`` the outputs.

Mirrors PyTorch's ``torch/nn/parallel/scatter_gather.py``
(https://github.com/pytorch/pytorch/blob/main/torch/nn/parallel/scatter_gather.py),
with the same signatures and semantics, on any list of devices, simulated ones
included (notebooks 02, 04, 05):

- ``scatter(inputs, target_gpus, dim=0)``: tensors -> ``tensor.chunk(n, dim)``
  (``ceil(B/n)`` rows each, possibly fewer than n chunks), one chunk per device;
  anything else is the same object once per device; tuples, lists, dicts and
  namedtuples are rebuilt with ``zip`` (cut to the shortest). A lone tensor gives a
  tuple, anything else a list (as in PyTorch).
- ``scatter_kwargs(inputs, kwargs, target_gpus, dim=0) -> (inputs, kwargs)``:
  tuples of per-device positional tuples and keyword dicts, padded like PyTorch:
  more keyword dicts than positional tuples -> positional padded with ``()``; else
  fewer keyword dicts than ``len(inputs)`` (the *unscattered* inputs) -> keywords
  padded with ``{}``. This padding is the root of notebook 04's pitfall.
- ``gather(outputs, target_device, dim=0)``: ``torch.cat`` on ``target_device``;
  0-dim outputs gathered along dim 0 become a vector, with PyTorch's warning.
- ``scatter_sizes(batch, n)``: the rows per chunk ``scatter`` makes.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch

from multigpu.core.devices import Device
from multigpu.dataparallel.placement import (
    DeviceSpec,
    check_devices,
    device_of,
    move,
    place,
    resolve,
)

__all__ = ["gather", "scatter", "scatter_kwargs", "scatter_sizes"]


def _is_namedtuple(obj: Any) -> bool:
    fields = hasattr(obj, "_asdict") and hasattr(obj, "_fields")
    return isinstance(obj, tuple) and fields


def scatter_sizes(batch_size: int, device_count: int) -> list[int]:
    """Rows per chunk when ``scatter`` splits ``batch_size`` rows over
    ``device_count`` devices: ``tensor.chunk`` sizes, ceil(B/n) each (04)."""
    return [len(c) for c in torch.empty(batch_size).chunk(device_count)]


def _scatter_tensor(
    tensor: torch.Tensor, devices: list[Device], dim: int
) -> tuple[torch.Tensor, ...]:
    source = device_of(tensor)
    chunks = tensor.chunk(len(devices), dim)  # fewer than len(devices) if B < n
    return tuple(
        move(chunk, source, device)
        for chunk, device in zip(chunks, devices, strict=False)
    )


def scatter(inputs: Any, target_gpus: Sequence[DeviceSpec], dim: int = 0) -> Any:
    """Split tensors into ``tensor.chunk(len(target_gpus), dim)`` pieces, one per
    device; copy references to anything else once per device (02, 04)."""
    devices = check_devices(target_gpus, "scatter")

    def scatter_map(obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            return _scatter_tensor(obj, devices, dim)
        # Containers: scatter every entry, then regroup per device with zip,
        # which stops at the shortest entry (strict=False, as in PyTorch).
        if _is_namedtuple(obj):
            per_entry = map(scatter_map, obj)
            return [type(obj)(*args) for args in zip(*per_entry, strict=False)]
        if isinstance(obj, tuple) and len(obj) > 0:
            return list(zip(*map(scatter_map, obj), strict=False))
        if isinstance(obj, list) and len(obj) > 0:
            return [list(i) for i in zip(*map(scatter_map, obj), strict=False)]
        if isinstance(obj, dict) and len(obj) > 0:
            per_item = map(scatter_map, obj.items())
            return [type(obj)(i) for i in zip(*per_item, strict=False)]
        # Anything else (numbers, strings, None, empty containers): the same
        # object once per device, not a copy.
        return [obj for _ in devices]

    try:
        return scatter_map(inputs)
    finally:
        scatter_map = None  # break the closure's reference cycle, as PyTorch does


def scatter_kwargs(
    inputs: tuple[Any, ...],
    kwargs: dict[str, Any] | None,
    target_gpus: Sequence[DeviceSpec],
    dim: int = 0,
) -> tuple[tuple[Any, ...], tuple[dict[str, Any], ...]]:
    """``scatter`` positional and keyword inputs, then pad the shorter list like
    PyTorch: extra ``()`` or ``{}`` entries (02, 04)."""
    check_devices(target_gpus, "scatter_kwargs")
    scattered_inputs = scatter(inputs, target_gpus, dim) if inputs else []
    scattered_kwargs = scatter(kwargs, target_gpus, dim) if kwargs else []
    if len(scattered_inputs) < len(scattered_kwargs):
        scattered_inputs.extend(
            () for _ in range(len(scattered_kwargs) - len(scattered_inputs))
        )
    elif len(scattered_kwargs) < len(inputs):  # len(inputs), as in PyTorch
        scattered_kwargs.extend(
            {} for _ in range(len(scattered_inputs) - len(scattered_kwargs))
        )
    return tuple(scattered_inputs), tuple(scattered_kwargs)


def _gather_tensors(
    tensors: Sequence[torch.Tensor], target: Device, dim: int
) -> torch.Tensor:
    if all(t.dim() == 0 for t in tensors) and dim == 0:
        tensors = [t.view(1) for t in tensors]
        warnings.warn(
            "Was asked to gather along dimension 0, but all "
            "input tensors were scalars; will instead unsqueeze "
            "and return a vector.",
            stacklevel=2,
        )
    gathered = torch.cat([t.to(target.torch_device) for t in tensors], dim)
    return place(gathered, target)


def gather(outputs: Any, target_device: DeviceSpec, dim: int = 0) -> Any:
    """Concatenate the replicas' outputs along ``dim`` on ``target_device``
    (-1 or "cpu" for the CPU); containers are gathered entry by entry (02, 05)."""
    if len(outputs) == 0:
        raise ValueError(
            "gather got no outputs to gather. Pass one output per replica, as "
            "returned by parallel_apply."
        )
    target = resolve(target_device)

    def gather_map(outputs: Any) -> Any:
        out = outputs[0]
        if isinstance(out, torch.Tensor):
            return _gather_tensors(outputs, target, dim)
        if out is None:
            return None
        if isinstance(out, dict):
            if not all(len(out) == len(d) for d in outputs):
                raise ValueError("All dicts must have the same number of keys")
            return type(out)((k, gather_map([d[k] for d in outputs])) for k in out)
        if _is_namedtuple(out):
            return type(out)._make(map(gather_map, zip(*outputs, strict=True)))
        return type(out)(map(gather_map, zip(*outputs, strict=True)))

    try:
        return gather_map(outputs)
    finally:
        gather_map = None  # break the closure's reference cycle, as PyTorch does
