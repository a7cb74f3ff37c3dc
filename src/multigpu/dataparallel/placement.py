"""Which (possibly simulated) device a tensor lives on, and moving it there.

The counterpart of what CUDA does for PyTorch's DataParallel: a tensor on a real
GPU knows its ``tensor.device``, and ``tensor.to("cuda:1")`` copies it. A simulated
device ("gpu:0", "gpu:1", ... from ``multigpu.core.devices.simulated_devices``) stores
its tensors on the CPU, so ``tensor.device`` cannot say which simulated GPU a
tensor belongs to. A weak registry (a ``torch.utils.weak.WeakIdKeyDictionary``, so
it never keeps a tensor alive) maps tensors to the ``Device`` they were placed on.
``to_device`` and the four steps write to it; ``device_of`` reads it and falls back
to ``tensor.device`` ("cpu" or "cuda:N") for tensors it does not know, including
new tensors you compute from simulated ones outside the four steps (place them with
``to_device`` if you need to). Moving a tensor between two *different* simulated
devices makes a real copy (``clone``), as a transfer between GPUs would; on the
device it already lives on, nothing is copied.

``to_device(module, device)`` moves a module in place, like ``module.to``, its
parameters' ``.grad`` included. It also gives each parameter a hook
(``register_post_accumulate_grad_hook``) that places a new ``.grad`` on the
parameter's device after every backward, so ``device_of(param.grad)`` answers like
``param.grad.device`` does on a real GPU. Use ``to_device`` rather than
``module.to("cpu")`` to move a module off a simulated device: ``.to`` does not know
about the registry.

``watch_moves(callback)`` lets an observer (the recorder in ``recording.py``) see
every move while it is active, with its start and end times; the four steps do
not know about it. Taught in notebooks 02 and 03.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from itertools import chain
from typing import Any

import torch
from torch import nn
from torch.utils.weak import WeakIdKeyDictionary

from multigpu.core.devices import Device, resolve_device

__all__ = ["DeviceSpec", "device_of", "to_device", "watch_moves"]

DeviceSpec = Device | torch.device | str | int

_placement: WeakIdKeyDictionary = WeakIdKeyDictionary()  # tensor -> Device
_placement_lock = threading.Lock()

# callback(moved tensor, target device, start, end), times from time.perf_counter()
MoveObserver = Callable[[torch.Tensor, Device, float, float], None]
_move_observers: list[MoveObserver] = []


def resolve(spec: DeviceSpec) -> Device:
    """Like ``resolve_device``, and -1 means the CPU (as in ``gather``)."""
    if isinstance(spec, int) and not isinstance(spec, bool) and spec == -1:
        return resolve_device("cpu")
    return resolve_device(spec)


def place(tensor: torch.Tensor, device: Device) -> torch.Tensor:
    """Record that ``tensor`` lives on ``device``; return it."""
    with _placement_lock:
        _placement[tensor] = device
    return tensor


def is_placed(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` was placed on a device (by ``place`` or a move)."""
    with _placement_lock:
        return tensor in _placement


def device_of(tensor: torch.Tensor) -> Device:
    """The device ``tensor`` was placed on: a simulated "gpu:N", else its real
    ``tensor.device`` as a ``Device`` (02, 03)."""
    with _placement_lock:
        device = _placement.get(tensor)
    if device is not None and device.torch_device == tensor.device:
        return device
    return Device(str(tensor.device), tensor.device)


def move(tensor: torch.Tensor, source: Device, target: Device) -> torch.Tensor:
    """``tensor`` (living on ``source``) as a tensor on ``target``; differentiable."""
    start = time.perf_counter() if _move_observers else 0.0
    if source.name == target.name:
        moved = tensor  # already there: no copy, as ``Tensor.to`` does
    elif source.torch_device == target.torch_device:
        moved = tensor.clone()  # between simulated devices: a real copy
    else:
        moved = tensor.to(target.torch_device)
    place(moved, target)
    if _move_observers:
        end = time.perf_counter()
        for observer in list(_move_observers):
            observer(moved, target, start, end)
    return moved


@contextmanager
def watch_moves(observer: MoveObserver) -> Iterator[None]:
    """Call ``observer(moved, target, start, end)`` after every move made inside the
    ``with`` body (times from ``time.perf_counter``)."""
    _move_observers.append(observer)
    try:
        yield
    finally:
        _move_observers.remove(observer)


_grad_hooked: WeakIdKeyDictionary = WeakIdKeyDictionary()  # parameter -> True


def _place_grad(param: torch.Tensor) -> None:
    """After backward: ``param.grad`` lives where ``param`` lives, as on a GPU."""
    if param.grad is not None:
        device = device_of(param)
        if device.simulated:
            place(param.grad, device)


def _track_grads(param: torch.Tensor) -> None:
    """Hook ``param`` once so that every new ``.grad`` is placed with it."""
    with _placement_lock:
        if param in _grad_hooked or not param.is_leaf:
            return
        _grad_hooked[param] = True
    param.register_post_accumulate_grad_hook(_place_grad)


def to_device(obj: torch.Tensor | nn.Module, device: DeviceSpec) -> Any:
    """``obj.to(device)`` that understands simulated devices: a module is moved in
    place (gradients too) and returned, a tensor is returned on ``device`` (02, 03)."""
    target = resolve(device)
    if isinstance(obj, nn.Module):
        obj.to(target.torch_device)
        for tensor in chain(obj.parameters(), obj.buffers()):
            place(tensor, target)
        for param in obj.parameters():
            _track_grads(param)
            if param.grad is not None:
                place(param.grad, target)
        return obj
    if isinstance(obj, torch.Tensor):
        return move(obj, device_of(obj), target)
    raise TypeError(
        f"to_device moves a tensor or an nn.Module, got {type(obj).__name__}. "
        "Move the tensors inside it one by one."
    )


def tensors_in(obj: Any) -> Iterator[torch.Tensor]:
    """Every tensor inside ``obj`` (tensors, lists, tuples, dicts)."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            yield from tensors_in(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from tensors_in(item)


def nbytes(obj: Any) -> int:
    """Bytes of every tensor inside ``obj``."""
    return sum(t.numel() * t.element_size() for t in tensors_in(obj))


def check_devices(devices: Sequence[DeviceSpec], what: str) -> list[Device]:
    """``devices`` resolved; a clear error for a single device or an empty list."""
    if isinstance(devices, (str, Device, torch.device, int)):
        raise TypeError(
            f"{what} needs a list of devices, got the single device {devices!r}. "
            "Wrap it in a list, e.g. [devices[0]]."
        )
    resolved = [resolve(d) for d in devices]
    if not resolved:
        raise ValueError(
            f"{what} got an empty list of devices. Pass at least one, e.g. "
            "multigpu.core.devices.simulated_devices(2)."
        )
    return resolved
